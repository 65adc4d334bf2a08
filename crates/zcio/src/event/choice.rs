//! The per-workload choice of how the `EPOLL_WAIT` backend collects its epoll instance: with
//! the ring's `IORING_OP_EPOLL_WAIT` ([`WaitMode::Ring`]) or with a plain `epoll_wait(2)`
//! ([`WaitMode::Plain`]) on the same instance. Sans-IO: observations of waits in, decisions
//! out; the backend does the I/O and the switch (`docs/design/event.md`, "Choice per
//! workload").
//!
//! Both modes read the same kernel epoll, so their reports are identical and their per-event
//! costs (epoll's callback, ready list, level re-check) are the same; what differs is the cost
//! of the collection itself. Measured on this project's machine (kernel 6.18, CPU time per
//! `wait` over 200 000 waits; `docs/design/event.md`, "Choice per workload"):
//!
//! | wait | ring | plain | ring − plain |
//! |---|---|---|---|
//! | something ready (1 or 16 fds) | 1 entry, +≈550 ns | 1 entry (`epoll_wait(0)`, within 70 ns of raw epoll) | [`Costs::ring_ready_ns`] |
//! | zero timeout, nothing ready | 2 entries (arm, cancel) with COOP_TASKRUN, 1 with DEFER_TASKRUN | 1 entry | 2 200 / 250 ns ([`Costs::ring_empty_ns`]) |
//! | blocking, nothing ready, no [`super::Poster`] | 1 entry, sleeps in the ring | 1 entry, sleeps in `epoll_wait` | 0 (not credited) |
//! | blocking, nothing ready, a poster exists | 1 entry | 2 entries: `epoll_wait(0)` misses, then the ring sleep (only the ring also watches the posters' eventfd, which stays out of the caller's epoll) | −450 ns ([`Costs::plain_sleep_ns`]) |
//!
//! So the decision is on the CPU time a window of waits would have saved in the other mode.
//! Events per wait and user-posted events are reported with each decision; the
//! level-triggered share changes nothing between the two modes (epoll re-checks in both).
//!
//! Against flapping: a decision is taken over a window of [`Chooser::WINDOW`] waits; the
//! saving must leave a dead band of ±[`Chooser::BAND_NS`] per wait; the same preference must
//! hold for [`Chooser::CONFIRM`] consecutive windows; and after a switch the mode is kept for
//! at least [`Chooser::DWELL`] windows.

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
    /// A [`super::Poster`] existed: a plain-mode sleep goes through the ring.
    pub poster: bool,
}

/// What the ring wait costs over plain `epoll_wait`, per wait, in nanoseconds of CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// A wait that finds events ready at once.
    pub ring_ready_ns: f64,
    /// A zero-timeout wait that finds nothing.
    pub ring_empty_ns: f64,
    /// What a plain sleep costs over the ring's when it must go through the ring (a poster
    /// exists): a missed `epoll_wait(0)` and its kernel entry.
    pub plain_sleep_ns: f64,
}

impl Costs {
    /// The measured costs for a ring with or without DEFER_TASKRUN.
    pub fn measured(defer_taskrun: bool) -> Self {
        Self {
            ring_ready_ns: 550.0,
            ring_empty_ns: if defer_taskrun { 250.0 } else { 2200.0 },
            plain_sleep_ns: 450.0,
        }
    }
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
    /// Sleeps while a poster existed.
    poster_sleeps: u32,
}

/// The decision state of one instance.
#[derive(Debug, Clone)]
pub struct Chooser {
    mode: WaitMode,
    costs: Costs,
    win: Window,
    /// Consecutive windows preferring the other mode.
    streak: u32,
    /// Windows since the last switch.
    since_switch: u32,
}

impl Chooser {
    /// Waits per decision window.
    pub const WINDOW: u32 = 128;
    /// Dead band around zero, in nanoseconds saved per wait.
    pub const BAND_NS: f64 = 100.0;
    /// Consecutive windows that must prefer the other mode before a switch.
    pub const CONFIRM: u32 = 2;
    /// Windows a mode is kept after a switch.
    pub const DWELL: u32 = 4;

    /// Starts in `mode`, deciding with `costs`.
    pub fn new(mode: WaitMode, costs: Costs) -> Self {
        Self {
            mode,
            costs,
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
        w.poster_sleeps += u32::from(o.slept && o.poster);
        if w.waits < Self::WINDOW {
            return None;
        }
        let w = std::mem::take(&mut self.win);
        self.since_switch = self.since_switch.saturating_add(1);
        let waits = f64::from(w.waits);
        let ready = w.waits - w.empty_polls - w.sleeps;
        let c = self.costs;
        // CPU per wait that epoll_wait saves over the ring wait.
        let saving = (f64::from(ready) * c.ring_ready_ns
            + f64::from(w.empty_polls) * c.ring_empty_ns
            - f64::from(w.poster_sleeps) * c.plain_sleep_ns)
            / waits;
        let prefer = if saving >= Self::BAND_NS {
            WaitMode::Plain
        } else if saving <= -Self::BAND_NS {
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
            "over {} waits: {:.2} found events at once, {:.2} empty zero-timeout polls, \
             {:.2} sleeps ({:.2} with a poster) per wait: epoll_wait saves {saving:+.0} ns \
             per wait; {:.1} events per wait, {:.0}% user-posted",
            w.waits,
            f64::from(ready) / waits,
            f64::from(w.empty_polls) / waits,
            f64::from(w.sleeps) / waits,
            f64::from(w.poster_sleeps) / waits,
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

    const COOP: Costs = Costs {
        ring_ready_ns: 550.0,
        ring_empty_ns: 2200.0,
        plain_sleep_ns: 450.0,
    };

    const POLL_EMPTY: WaitObs = WaitObs {
        fd_events: 0,
        user_events: 0,
        empty_poll: true,
        slept: false,
        poster: false,
    };
    const READY: WaitObs = WaitObs {
        fd_events: 4,
        user_events: 0,
        empty_poll: false,
        slept: false,
        poster: false,
    };
    /// A sleep while a poster exists (a plain sleep would go through the ring).
    const SLEEP: WaitObs = WaitObs {
        fd_events: 1,
        user_events: 0,
        empty_poll: false,
        slept: true,
        poster: true,
    };
    /// A sleep with no poster (a plain sleep is a plain `epoll_wait`).
    const SLEEP_ALONE: WaitObs = WaitObs {
        poster: false,
        ..SLEEP
    };

    /// Feeds `windows` windows whose waits cycle through `pattern`; returns the decisions.
    fn feed(c: &mut Chooser, pattern: &[WaitObs], windows: u32) -> Vec<Decision> {
        let mut out = Vec::new();
        for i in 0..(windows * Chooser::WINDOW) as usize {
            if let Some(d) = c.observe(pattern[i % pattern.len()]) {
                out.push(d);
            }
        }
        out
    }

    #[test]
    fn a_zero_timeout_polling_loop_converges_to_epoll_wait_once() {
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        let d = feed(&mut c, &[POLL_EMPTY, READY], 20);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].from, d[0].to), (WaitMode::Ring, WaitMode::Plain));
        assert!(d[0].reason.contains("0.50 empty"), "{}", d[0].reason);
        // (0.5 × 2200 + 0.5 × 550) ns per wait.
        assert!(d[0].reason.contains("+1375 ns"), "{}", d[0].reason);
        assert_eq!(c.mode(), WaitMode::Plain);
    }

    #[test]
    fn the_switch_needs_confirming_windows() {
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        assert!(feed(&mut c, &[POLL_EMPTY], Chooser::CONFIRM - 1).is_empty());
        assert_eq!(feed(&mut c, &[POLL_EMPTY], 1).len(), 1);
    }

    #[test]
    fn a_busy_loop_whose_waits_find_events_goes_to_epoll_wait_and_stays() {
        for start in [WaitMode::Ring, WaitMode::Plain] {
            let mut c = Chooser::new(start, COOP);
            let d = feed(&mut c, &[READY], 50);
            assert_eq!(d.len(), usize::from(start == WaitMode::Ring), "{d:?}");
            assert_eq!(c.mode(), WaitMode::Plain);
        }
    }

    #[test]
    fn a_loop_that_mostly_sleeps_with_a_poster_stays_on_the_ring() {
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        assert!(feed(&mut c, &[SLEEP, SLEEP, READY], 50).is_empty());
        assert_eq!(c.mode(), WaitMode::Ring);
    }

    #[test]
    fn without_a_poster_sleeps_cost_the_same_and_ready_waits_decide() {
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        let d = feed(&mut c, &[SLEEP_ALONE, SLEEP_ALONE, READY], 10);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].to, WaitMode::Plain);
        // Only sleeps: nothing to gain either way, no switch.
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        assert!(feed(&mut c, &[SLEEP_ALONE], 50).is_empty());
    }

    #[test]
    fn the_epoll_shims_request_response_instance_goes_to_epoll_wait_after_two_windows() {
        // What the shim feeds for an owner's ring waits (DEFER_TASKRUN, no poster credit: a
        // handed instance sleeps in epoll_wait itself): one event per wait, waits that only
        // time out count as sleeps.
        let one = WaitObs {
            fd_events: 1,
            ..WaitObs::default()
        };
        let mut c = Chooser::new(WaitMode::Ring, Costs::measured(true));
        assert!(feed(&mut c, &[one], Chooser::CONFIRM - 1).is_empty());
        let d = feed(&mut c, &[one], 1);
        assert_eq!(d.len(), 1, "decided at the second window: {d:?}");
        assert!(d[0].reason.contains("+550 ns"), "{}", d[0].reason);
        assert!(
            d[0].reason.contains("1.0 events per wait"),
            "{}",
            d[0].reason
        );
        // An idle loop (its timer's timeouts) stays on the ring.
        let mut c = Chooser::new(WaitMode::Ring, Costs::measured(true));
        assert!(feed(&mut c, &[SLEEP_ALONE], 50).is_empty());
    }

    #[test]
    fn with_defer_taskrun_an_empty_poll_weighs_less() {
        let defer = Costs::measured(true);
        // One empty poll (+250) against two poster sleeps (−900): ring.
        let mut c = Chooser::new(WaitMode::Plain, defer);
        let d = feed(&mut c, &[POLL_EMPTY, SLEEP, SLEEP], 10);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].to, WaitMode::Ring);
        // With COOP_TASKRUN the same workload is epoll_wait's (+2200 − 900).
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        let d = feed(&mut c, &[POLL_EMPTY, SLEEP, SLEEP], 10);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].to, WaitMode::Plain);
    }

    #[test]
    fn a_workload_inside_the_dead_band_does_not_flap() {
        // 9 ready (+550 each) and 11 poster sleeps (−450 each) per 20 waits: ≈ 0 ns per wait.
        let mut pattern = vec![READY; 9];
        pattern.extend([SLEEP; 11]);
        for start in [WaitMode::Ring, WaitMode::Plain] {
            let mut c = Chooser::new(start, COOP);
            assert!(feed(&mut c, &pattern, 100).is_empty());
        }
    }

    #[test]
    fn alternating_windows_never_confirm_a_switch() {
        // One window favours epoll_wait, the next the ring, and so on: no switch at all.
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        let mut switches = 0;
        for k in 0..100 {
            let p: &[WaitObs] = if k % 2 == 0 { &[POLL_EMPTY] } else { &[SLEEP] };
            switches += feed(&mut c, p, 1).len();
        }
        assert_eq!(switches, 0);
    }

    #[test]
    fn a_changing_workload_is_re_decided_after_the_dwell() {
        let mut c = Chooser::new(WaitMode::Ring, COOP);
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
    fn a_workload_flipping_faster_than_the_dwell_switches_at_most_once_per_dwell() {
        let mut c = Chooser::new(WaitMode::Ring, COOP);
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
        let mut c = Chooser::new(WaitMode::Ring, COOP);
        let posted = WaitObs {
            fd_events: 1,
            user_events: 3,
            ..READY
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
