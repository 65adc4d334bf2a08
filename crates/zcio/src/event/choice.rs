//! The per-workload choice of how the `EPOLL_WAIT` backend collects its epoll instance: with
//! the ring's `IORING_OP_EPOLL_WAIT` ([`WaitMode::Ring`]) or with a plain `epoll_wait(2)`
//! ([`WaitMode::Plain`]) on the same instance. Sans-IO: observations of waits in, decisions
//! out; the backend does the I/O and the switch (`docs/design/event.md`, "Choice per
//! workload").
//!
//! Both modes read the same kernel epoll, so their reports are identical and their per-event
//! costs (epoll's callback, ready list, level re-check) are the same; what differs is the
//! number of kernel entries a wait costs:
//!
//! | wait | ring | plain |
//! |---|---|---|
//! | something ready | 1 | 1 (`epoll_wait(0)`) |
//! | zero timeout, nothing ready | 2 with COOP_TASKRUN (arm, then cancel and reap), 1 with DEFER_TASKRUN (stays armed) | 1 |
//! | blocking, nothing ready | 1 (sleeps in the ring) | 2 (`epoll_wait(0)` misses, then the ring sleep) |
//!
//! (Plain mode sleeps through the ring because only the ring also watches the user-posted
//! events' eventfd without putting a foreign fd into the caller's epoll instance.) So the
//! decision is on `empty_polls × (ring cost − 1) − sleeps` per wait: positive means
//! `epoll_wait` saves entries. Events per wait, user-posted events and the level-triggered
//! share change nothing between the two modes (same epoll, same user ring) and are reported
//! with each decision, not weighed.
//!
//! Against flapping: a decision is taken over a window of [`Chooser::WINDOW`] waits; the
//! saving must leave a dead band of ±[`Chooser::BAND`] entries per wait; the same preference
//! must hold for [`Chooser::CONFIRM`] consecutive windows; and after a switch the mode is kept
//! for at least [`Chooser::DWELL`] windows.

/// How the epoll instance is collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// One `IORING_OP_EPOLL_WAIT` per wait.
    Ring,
    /// `epoll_wait(2)` with a zero timeout; the ring only to sleep.
    Plain,
}

impl WaitMode {
    /// The name used in decisions and reports.
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Ring => "io_uring EPOLL_WAIT ring wait",
            WaitMode::Plain => "epoll_wait on the same epoll instance",
        }
    }
}

/// What one `wait` showed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitObs {
    /// Fd events returned.
    pub fd_events: u32,
    /// User-posted events returned.
    pub user_events: u32,
    /// A zero-timeout wait that found nothing.
    pub empty_poll: bool,
    /// A blocking wait that found nothing ready and had to sleep.
    pub slept: bool,
}

/// A switch, with its reason in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The mode left.
    pub from: WaitMode,
    /// The mode taken.
    pub to: WaitMode,
    /// What the workload showed.
    pub reason: String,
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    waits: u32,
    fd_events: u64,
    user_events: u64,
    empty_polls: u32,
    sleeps: u32,
}

/// The decision state of one instance.
#[derive(Debug, Clone)]
pub struct Chooser {
    mode: WaitMode,
    /// Kernel entries a zero-timeout wait that finds nothing costs in ring mode.
    ring_empty_poll: u32,
    win: Window,
    /// Consecutive windows preferring the other mode.
    streak: u32,
    /// Windows since the last switch.
    since_switch: u32,
}

impl Chooser {
    /// Waits per decision window.
    pub const WINDOW: u32 = 128;
    /// Dead band, in kernel entries saved per wait, around zero.
    pub const BAND: f64 = 0.1;
    /// Consecutive windows that must prefer the other mode before a switch.
    pub const CONFIRM: u32 = 2;
    /// Windows a mode is kept after a switch.
    pub const DWELL: u32 = 4;

    /// Starts in `mode`; `ring_empty_poll` is what a zero-timeout wait that finds nothing
    /// costs in ring mode (2 with COOP_TASKRUN, 1 with DEFER_TASKRUN).
    pub fn new(mode: WaitMode, ring_empty_poll: u32) -> Self {
        Self {
            mode,
            ring_empty_poll,
            win: Window::default(),
            streak: 0,
            since_switch: Self::DWELL,
        }
    }

    /// The current mode.
    pub fn mode(&self) -> WaitMode {
        self.mode
    }

    /// Takes the mode set from outside (a pin, or the end of one), forgetting the window.
    pub fn reset(&mut self, mode: WaitMode) {
        self.mode = mode;
        self.win = Window::default();
        self.streak = 0;
        self.since_switch = 0;
    }

    /// Feeds one wait; returns a decision when the mode changes.
    pub fn observe(&mut self, o: WaitObs) -> Option<Decision> {
        let w = &mut self.win;
        w.waits += 1;
        w.fd_events += u64::from(o.fd_events);
        w.user_events += u64::from(o.user_events);
        w.empty_polls += u32::from(o.empty_poll);
        w.sleeps += u32::from(o.slept);
        if w.waits < Self::WINDOW {
            return None;
        }
        let w = std::mem::take(&mut self.win);
        self.since_switch = self.since_switch.saturating_add(1);
        let waits = f64::from(w.waits);
        let extra = f64::from(self.ring_empty_poll.saturating_sub(1));
        // Entries per wait that epoll_wait saves over the ring wait.
        let saving = (f64::from(w.empty_polls) * extra - f64::from(w.sleeps)) / waits;
        let prefer = if saving >= Self::BAND {
            WaitMode::Plain
        } else if saving <= -Self::BAND {
            WaitMode::Ring
        } else {
            self.mode
        };
        if prefer == self.mode {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak < Self::CONFIRM || self.since_switch < Self::DWELL {
            return None;
        }
        let events = w.fd_events + w.user_events;
        let reason = format!(
            "over {} waits: {:.2} empty zero-timeout polls and {:.2} sleeps per wait \
             (a ring poll costs {} kernel entries, epoll_wait 1; a sleep 1 vs 2): \
             epoll_wait saves {saving:+.2} entries per wait; {:.1} events per wait, \
             {:.0}% user-posted",
            w.waits,
            f64::from(w.empty_polls) / waits,
            f64::from(w.sleeps) / waits,
            self.ring_empty_poll,
            events as f64 / waits,
            if events == 0 {
                0.0
            } else {
                100.0 * w.user_events as f64 / events as f64
            },
        );
        let d = Decision {
            from: self.mode,
            to: prefer,
            reason,
        };
        self.mode = prefer;
        self.streak = 0;
        self.since_switch = 0;
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL_EMPTY: WaitObs = WaitObs {
        fd_events: 0,
        user_events: 0,
        empty_poll: true,
        slept: false,
    };
    const READY: WaitObs = WaitObs {
        fd_events: 4,
        user_events: 0,
        empty_poll: false,
        slept: false,
    };
    const SLEEP: WaitObs = WaitObs {
        fd_events: 1,
        user_events: 0,
        empty_poll: false,
        slept: true,
    };

    /// Feeds `n` windows whose waits cycle through `pattern`; returns the decisions.
    fn feed(c: &mut Chooser, pattern: &[WaitObs], windows: u32) -> Vec<Decision> {
        let mut out = Vec::new();
        let mut i = 0usize;
        for _ in 0..windows * Chooser::WINDOW {
            if let Some(d) = c.observe(pattern[i % pattern.len()]) {
                out.push(d);
            }
            i += 1;
        }
        out
    }

    #[test]
    fn a_zero_timeout_polling_loop_converges_to_epoll_wait_once() {
        let mut c = Chooser::new(WaitMode::Ring, 2);
        // Half the polls find nothing: epoll_wait saves 0.5 entries per wait.
        let d = feed(&mut c, &[POLL_EMPTY, READY], 20);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].from, d[0].to), (WaitMode::Ring, WaitMode::Plain));
        assert!(d[0].reason.contains("0.50 empty"), "{}", d[0].reason);
        assert_eq!(c.mode(), WaitMode::Plain);
    }

    #[test]
    fn the_switch_needs_confirming_windows() {
        let mut c = Chooser::new(WaitMode::Ring, 2);
        assert!(feed(&mut c, &[POLL_EMPTY], Chooser::CONFIRM - 1).is_empty());
        assert_eq!(feed(&mut c, &[POLL_EMPTY], 1).len(), 1);
    }

    #[test]
    fn a_sleeping_loop_stays_on_the_ring() {
        let mut c = Chooser::new(WaitMode::Ring, 2);
        assert!(feed(&mut c, &[SLEEP, READY, READY], 50).is_empty());
        assert_eq!(c.mode(), WaitMode::Ring);
    }

    #[test]
    fn a_busy_loop_whose_waits_always_find_events_never_switches() {
        for start in [WaitMode::Ring, WaitMode::Plain] {
            let mut c = Chooser::new(start, 2);
            assert!(feed(&mut c, &[READY], 50).is_empty());
            assert_eq!(c.mode(), start);
        }
    }

    #[test]
    fn with_defer_taskrun_empty_polls_cost_the_same_so_the_ring_stays() {
        let mut c = Chooser::new(WaitMode::Ring, 1);
        assert!(feed(&mut c, &[POLL_EMPTY, POLL_EMPTY, SLEEP], 50).is_empty());
        // And a plain start with sleeps goes back to the ring.
        let mut c = Chooser::new(WaitMode::Plain, 1);
        let d = feed(&mut c, &[POLL_EMPTY, SLEEP], 10);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].to, WaitMode::Ring);
    }

    #[test]
    fn a_workload_inside_the_dead_band_does_not_flap() {
        // 2 empty polls per 20 waits, 1 sleep: saving (2 − 1)/20 = 0.05 < BAND, either way.
        let mut pattern = vec![READY; 17];
        pattern.extend([POLL_EMPTY, POLL_EMPTY, SLEEP]);
        for start in [WaitMode::Ring, WaitMode::Plain] {
            let mut c = Chooser::new(start, 2);
            assert!(feed(&mut c, &pattern, 100).is_empty());
        }
    }

    #[test]
    fn alternating_windows_never_confirm_a_switch() {
        // One window favours epoll_wait, the next the ring, and so on: no switch at all.
        let mut c = Chooser::new(WaitMode::Ring, 2);
        let mut switches = 0;
        for k in 0..100 {
            let p: &[WaitObs] = if k % 2 == 0 { &[POLL_EMPTY] } else { &[SLEEP] };
            switches += feed(&mut c, p, 1).len();
        }
        assert_eq!(switches, 0);
    }

    #[test]
    fn a_changing_workload_is_re_decided_after_the_dwell() {
        let mut c = Chooser::new(WaitMode::Ring, 2);
        // Switched at the last of these windows.
        let d = feed(&mut c, &[POLL_EMPTY], Chooser::CONFIRM);
        assert_eq!(d.len(), 1);
        assert_eq!(c.mode(), WaitMode::Plain);
        // The workload turns into a sleeping one at once: back to the ring, not before DWELL
        // windows.
        let mut windows = 0;
        let mut back = Vec::new();
        while back.is_empty() {
            windows += 1;
            back = feed(&mut c, &[SLEEP], 1);
            assert!(windows < 50, "never re-decided");
        }
        assert!(windows >= Chooser::DWELL.max(Chooser::CONFIRM), "{windows}");
        assert_eq!(
            (back[0].from, back[0].to),
            (WaitMode::Plain, WaitMode::Ring)
        );
        assert!(back[0].reason.contains("1.00 sleeps"), "{}", back[0].reason);
        // And once more when it turns back.
        assert_eq!(feed(&mut c, &[POLL_EMPTY], 10).len(), 1);
        assert_eq!(c.mode(), WaitMode::Plain);
    }

    #[test]
    fn a_switch_that_would_come_back_at_once_is_held_for_the_dwell() {
        // Right after a switch the opposite preference is confirmed but held: the number of
        // switches over many windows stays bounded by one per DWELL windows.
        let mut c = Chooser::new(WaitMode::Ring, 2);
        let mut switches = 0;
        let windows = 200;
        for k in 0..windows {
            // Flip the workload every 3 windows (faster than DWELL).
            let p: &[WaitObs] = if (k / 3) % 2 == 0 {
                &[POLL_EMPTY]
            } else {
                &[SLEEP]
            };
            switches += feed(&mut c, p, 1).len() as u32;
        }
        assert!(switches <= windows / Chooser::DWELL, "{switches}");
    }

    #[test]
    fn reasons_report_events_per_wait_and_user_share() {
        let mut c = Chooser::new(WaitMode::Ring, 2);
        let posted = WaitObs {
            fd_events: 1,
            user_events: 3,
            empty_poll: false,
            slept: false,
        };
        let d = feed(&mut c, &[POLL_EMPTY, posted], 10);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].reason.contains("2.0 events per wait"),
            "{}",
            d[0].reason
        );
        assert!(d[0].reason.contains("75% user-posted"), "{}", d[0].reason);
    }
}
