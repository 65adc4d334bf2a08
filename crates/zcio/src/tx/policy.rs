//! `auto`'s decisions without I/O: [`AutoPolicy`] takes observations (completions with what
//! they said about copying, CPU time measured over runs of sends) and returns decisions
//! (copy or zero-copy for a send of a given size, and when the caller should read the clock).
//!
//! Two signals:
//!
//! - **COPIED**, per route (peer address; a socket without a peer is its own route):
//!   `copied_streak` zero-copy completions in a row that say the kernel copied anyway
//!   (loopback, local delivery) switch every size to copy for every socket to that peer;
//!   every `reprobe_every` copy sends to the route one zero-copy probe goes out (on whichever
//!   socket sends then), and a probe that comes back not copied switches back (else the
//!   interval doubles, up to 64×).
//! - **Cost by size**: sizes are grouped by power of two. For each group the policy measures
//!   the sender's CPU time per byte over *windows* of `WINDOW` consecutive sends of that group
//!   on one path (the first window after a change of path is a warm-up and is not counted:
//!   the notifications of the previous path's sends land in it). Until both paths have
//!   `MIN_SAMPLES` windows, it alternates; then it takes the cheaper. In that steady state the
//!   chosen path's windows are `STEADY` times longer (one clock read per window, so the
//!   per-send cost is one branch), and the other path is re-measured only briefly (a warm-up
//!   and one short window) and rarely: every `gap` steady windows, doubling up to `GAP_MAX`
//!   while the answer stays, or at once when the chosen path's own cost drifts by more than
//!   `DRIFT` from what it was when chosen (the change signal: a route change moves it).
//!   Groups never measured follow the nearest measured ones (copy below the learned
//!   threshold, zero-copy above), or the prior threshold before anything is measured.

use super::ZcStatus;

/// Sends per measurement window (fewer for large sends: a window ends after
/// `WINDOW_BYTES`, but has at least `WINDOW_MIN` sends).
pub(crate) const WINDOW: u32 = 32;
const WINDOW_BYTES: u64 = 4 << 20;
const WINDOW_MIN: u32 = 4;
/// Windows of each path a size group needs before the cheaper one is chosen.
const MIN_SAMPLES: u32 = 2;
/// Steady windows (the chosen path of a group that has chosen) are this many times longer.
const STEADY: u32 = 8;
/// Re-measurement gap (steady windows of the chosen path between two measurements of the
/// other), first and longest.
const GAP_MIN: u32 = 16;
const GAP_MAX: u32 = 1024;
/// The chosen path's cost moving this fraction away from its cost when chosen is a change
/// signal: the other path is re-measured at once.
const DRIFT: f64 = 0.25;
/// A chosen path is changed only when the other costs this fraction less.
const HYSTERESIS: f64 = 0.03;
/// Before anything is measured, sizes below this go by copy.
pub(crate) const PRIOR_COPY_BELOW: usize = 8 << 10;
const GROUPS: usize = 40;
/// After a window that ended unfilled (the sizes moved to another group first), the start of
/// only every this-many-th window is clocked (see [`AutoPolicy::decide_size`]).
const ABANDONED_CLOCK_EVERY: u32 = 16;

/// Which way one send goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    Copy,
    ZeroCopy,
}

/// What the policy wants for one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) choice: Choice,
    /// The caller reads the thread's CPU clock before this send and passes it to
    /// [`AutoPolicy::clock`].
    pub(crate) clock: bool,
    /// This send is a COPIED re-probe (its completion goes to [`AutoPolicy::observe`] with
    /// `probe = true`).
    pub(crate) probe: bool,
}

/// A change the caller records (fallbacks, stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// COPIED completions switched every size to copy (`streak` in a row).
    SwitchedToCopy { streak: u32, interval: u64 },
    /// A re-probe found zero-copy working: back to deciding by size.
    SwitchedBack,
}

/// Counters of the policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PolicyStats {
    pub(crate) switches_to_copy: u64,
    pub(crate) reprobes: u64,
    pub(crate) switches_back: u64,
    /// Sends sent by copy because copy is cheaper at their size.
    pub(crate) size_copies: u64,
    /// Measurement windows run on the path not chosen (re-measuring).
    pub(crate) explores: u64,
    /// Measurement windows counted.
    pub(crate) windows: u64,
    /// Re-measurements started by the chosen path's cost drifting (the change signal), not
    /// by the gap running out.
    pub(crate) drift_explores: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    /// Nanoseconds of CPU per byte, exponentially weighted (1/4 per window).
    per_byte: f64,
    samples: u32,
}

impl Cost {
    fn add(&mut self, x: f64) {
        self.per_byte = if self.samples == 0 {
            x
        } else {
            self.per_byte + (x - self.per_byte) / 4.0
        };
        self.samples = self.samples.saturating_add(1);
    }
}

#[derive(Debug, Clone, Copy)]
struct Group {
    cost: [Cost; 2],
    /// The chosen path, once both are measured.
    chosen: Option<Choice>,
    /// Windows of the chosen path left before the other is measured again.
    until_explore: u32,
    gap: u32,
    /// The chosen path's cost (ns/B) when it was last compared with the other.
    reference: f64,
}

impl Default for Group {
    fn default() -> Self {
        Self {
            cost: [Cost::default(); 2],
            chosen: None,
            until_explore: GAP_MIN,
            gap: GAP_MIN,
            reference: 0.0,
        }
    }
}

/// The window being measured.
#[derive(Debug, Clone, Copy)]
struct Window {
    group: usize,
    choice: Choice,
    sends: u32,
    bytes: u64,
    start_ns: Option<u64>,
    /// Warm-up window: run, not counted.
    warmup: bool,
    /// Steady window (`STEADY` times longer).
    steady: bool,
}

impl Window {
    fn full(&self) -> bool {
        let k = if self.steady { STEADY } else { 1 };
        self.sends >= WINDOW * k
            || (self.sends >= WINDOW_MIN && self.bytes >= WINDOW_BYTES * u64::from(k))
    }
}

/// The COPIED signal of one route (a send ring keeps one per peer address, shared by every
/// socket to that peer; a socket without a peer has its own): a streak of COPIED completions
/// moves every size to copy, and a re-probe that comes back not copied moves it back. One
/// re-probe is out at a time.
#[derive(Debug, Clone)]
pub(crate) struct CopiedWatch {
    copied_streak: u32,
    reprobe_every: u64,
    streak: u32,
    in_copy: bool,
    since_switch: u64,
    interval: u64,
    probe_out: bool,
    switches_to_copy: u64,
    reprobes: u64,
    switches_back: u64,
}

impl CopiedWatch {
    pub(crate) fn new(copied_streak: u32, reprobe_every: u64) -> Self {
        Self {
            copied_streak: copied_streak.max(1),
            reprobe_every: reprobe_every.max(1),
            streak: 0,
            in_copy: false,
            since_switch: 0,
            interval: reprobe_every.max(1),
            probe_out: false,
            switches_to_copy: 0,
            reprobes: 0,
            switches_back: 0,
        }
    }

    /// While COPIED completions hold every size on copy: copy, or now and then a zero-copy
    /// re-probe. `None`: the size policy decides.
    pub(crate) fn decide(&mut self) -> Option<Decision> {
        if !self.in_copy {
            return None;
        }
        self.since_switch += 1;
        if !self.probe_out && self.since_switch >= self.interval {
            self.since_switch = 0;
            self.probe_out = true;
            self.reprobes += 1;
            return Some(Decision {
                choice: Choice::ZeroCopy,
                clock: false,
                probe: true,
            });
        }
        Some(Decision {
            choice: Choice::Copy,
            clock: false,
            probe: false,
        })
    }

    /// A zero-copy send completed with `status`; `probe` = it was a COPIED re-probe.
    pub(crate) fn observe(&mut self, status: ZcStatus, probe: bool) -> Option<Event> {
        if probe {
            self.probe_out = false;
            if status == ZcStatus::ZeroCopy {
                self.in_copy = false;
                self.streak = 0;
                self.interval = self.reprobe_every;
                self.switches_back += 1;
                return Some(Event::SwitchedBack);
            }
            self.interval = (self.interval * 2).min(self.reprobe_every * 64);
            return None;
        }
        if self.in_copy {
            return None;
        }
        match status {
            ZcStatus::Copied | ZcStatus::Mixed => {
                self.streak += 1;
                if self.streak >= self.copied_streak {
                    self.in_copy = true;
                    self.since_switch = 0;
                    self.switches_to_copy += 1;
                    return Some(Event::SwitchedToCopy {
                        streak: self.streak,
                        interval: self.interval,
                    });
                }
            }
            ZcStatus::ZeroCopy => self.streak = 0,
            ZcStatus::NotAttempted | ZcStatus::Unknown => {}
        }
        None
    }

    /// Whether COPIED completions put every size on copy.
    pub(crate) fn in_copy(&self) -> bool {
        self.in_copy
    }

    /// Copy sends between two re-probes now.
    pub(crate) fn interval(&self) -> u64 {
        self.interval
    }

    /// The re-probe in flight will not be observed (its socket went before its completion
    /// was read): the next one may go.
    pub(crate) fn probe_lost(&mut self) {
        self.probe_out = false;
    }

    /// `(switches to copy, re-probes, switches back)` of the whole route (a ring counts them
    /// per socket, on the socket whose send or completion made each).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (self.switches_to_copy, self.reprobes, self.switches_back)
    }
}

/// `auto`'s policy: the COPIED watch of one socket and the cost by size. A shared send ring
/// keeps one cost-by-size part for all its sockets (its windows are runs of the thread's
/// sends, whichever socket they go to) and a watch per route. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct AutoPolicy {
    /// The COPIED watch of the one socket in the unit tests' combined use; a ring keeps one
    /// per route instead.
    #[cfg(test)]
    watch: CopiedWatch,
    groups: [Group; GROUPS],
    win: Option<Window>,
    /// A full window to close (count) at the next clock read.
    pending_close: Option<Window>,
    /// The path of the last window (a change means the next one is a warm-up).
    last_choice: Option<Choice>,
    /// Whether sizing by cost is on (off: every send zero-copy unless COPIED says copy).
    by_size: bool,
    /// [`AutoPolicy::copy_below`], kept up to date when a window is counted.
    copy_below: Option<usize>,
    /// Windows in a row that ended before they filled (0 after one that filled).
    abandoned: u32,
    stats: PolicyStats,
}

fn group_of(len: usize) -> usize {
    (usize::BITS - len.max(1).leading_zeros()) as usize % GROUPS
}

fn idx(c: Choice) -> usize {
    match c {
        Choice::Copy => 0,
        Choice::ZeroCopy => 1,
    }
}

impl AutoPolicy {
    pub(crate) fn new(copied_streak: u32, reprobe_every: u64, by_size: bool) -> Self {
        #[cfg(not(test))]
        let _ = (copied_streak, reprobe_every);
        Self {
            #[cfg(test)]
            watch: CopiedWatch::new(copied_streak, reprobe_every),
            groups: [Group::default(); GROUPS],
            win: None,
            pending_close: None,
            last_choice: None,
            by_size,
            copy_below: None,
            abandoned: 0,
            stats: PolicyStats::default(),
        }
    }

    /// The decision for a send of `len` bytes.
    #[cfg(test)]
    pub(crate) fn decide(&mut self, len: usize) -> Decision {
        if let Some(d) = self.watch.decide() {
            self.win = None;
            self.sync_watch();
            return d;
        }
        self.decide_size(len)
    }

    /// The cost-by-size decision for a send of `len` bytes (a socket whose COPIED watch does
    /// not hold it on copy).
    pub(crate) fn decide_size(&mut self, len: usize) -> Decision {
        if !self.by_size {
            return Decision {
                choice: Choice::ZeroCopy,
                clock: false,
                probe: false,
            };
        }
        let g = group_of(len);
        // Continue the current window if this send belongs to it.
        if let Some(w) = self.win.as_mut() {
            if w.group == g && !w.full() {
                w.sends += 1;
                w.bytes += len as u64;
                let choice = w.choice;
                return self.count(Decision {
                    choice,
                    clock: false,
                    probe: false,
                });
            }
        }
        // A new window starts (the previous one, if full, is closed by this clock read).
        let choice = self.next_choice(g, len);
        let warmup =
            self.last_choice != Some(choice) || self.win.is_some_and(|w| w.group != g || !w.full());
        let closing = self.win.filter(|w| w.full() && w.start_ns.is_some());
        self.pending_close = closing;
        // A window that ended unfilled is not counted, and while the sizes keep alternating
        // between groups (a proxy's requests and answers, a server's headers and bodies) the
        // next one will not fill either. Clocking each start would cost a syscall per send
        // for nothing (CLOCK_THREAD_CPUTIME_ID has no vDSO path), so after an unfilled window
        // only every ABANDONED_CLOCK_EVERY-th start is clocked: a run of one size, when it
        // comes, fills a clocked window within that many starts and is measured again. A full
        // window to close is always clocked.
        self.abandoned = match self.win {
            Some(w) if !w.full() => self.abandoned.saturating_add(1),
            _ => 0,
        };
        let clock = closing.is_some() || self.abandoned % ABANDONED_CLOCK_EVERY == 0;
        self.last_choice = Some(choice);
        let steady = self.groups[g].chosen == Some(choice);
        self.win = Some(Window {
            group: g,
            choice,
            sends: 1,
            bytes: len as u64,
            start_ns: None,
            warmup,
            steady,
        });
        self.count(Decision {
            choice,
            clock,
            probe: false,
        })
    }

    fn count(&mut self, d: Decision) -> Decision {
        if d.choice == Choice::Copy {
            self.stats.size_copies += 1;
        }
        d
    }

    /// Which path the next window of group `g` measures or uses.
    fn next_choice(&mut self, g: usize, len: usize) -> Choice {
        let prior = self.estimate(g, len);
        let grp = &mut self.groups[g];
        let c = grp.cost;
        if c[0].samples < MIN_SAMPLES || c[1].samples < MIN_SAMPLES {
            // Learn: the path with fewer counted windows, the cheaper-looking one first.
            return if c[idx(prior)].samples <= c[idx(other(prior))].samples {
                prior
            } else {
                other(prior)
            };
        }
        let mut best = if c[0].per_byte <= c[1].per_byte {
            Choice::Copy
        } else {
            Choice::ZeroCopy
        };
        if let Some(cur) = grp.chosen {
            // Hysteresis: measurements are noisy; change only for a clear gain.
            if c[idx(best)].per_byte > c[idx(cur)].per_byte * (1.0 - HYSTERESIS) {
                best = cur;
            }
        }
        if grp.chosen != Some(best) {
            grp.chosen = Some(best);
            grp.gap = GAP_MIN;
            grp.until_explore = GAP_MIN;
            grp.reference = c[idx(best)].per_byte;
        } else if grp.reference > 0.0
            && (c[idx(best)].per_byte - grp.reference).abs() > DRIFT * grp.reference
        {
            // The chosen path's cost moved: conditions changed, look at the other now.
            grp.gap = GAP_MIN;
            grp.until_explore = 0;
            grp.reference = c[idx(best)].per_byte;
            self.stats.drift_explores += 1;
        }
        if grp.until_explore == 0 {
            grp.reference = c[idx(best)].per_byte;
            grp.gap = (grp.gap * 2).min(GAP_MAX);
            grp.until_explore = grp.gap;
            self.stats.explores += 1;
            // Two windows: a warm-up and a counted one.
            return other(best);
        }
        if self.last_choice == Some(other(best))
            && self.win.is_some_and(|w| w.group == g && w.warmup)
        {
            // The exploration's counted window follows its warm-up.
            return other(best);
        }
        grp.until_explore -= 1;
        best
    }

    /// The decision for group `g` from what is known: its own measurements, else the
    /// nearest measured groups, else the prior threshold.
    fn estimate(&self, g: usize, len: usize) -> Choice {
        let known = |i: usize| {
            let c = self.groups[i].cost;
            (c[0].samples >= MIN_SAMPLES && c[1].samples >= MIN_SAMPLES).then(|| {
                if c[0].per_byte <= c[1].per_byte {
                    Choice::Copy
                } else {
                    Choice::ZeroCopy
                }
            })
        };
        if let Some(c) = known(g) {
            return c;
        }
        // Copy is cheaper below some size: a smaller group that prefers zero-copy means
        // zero-copy here, a larger one that prefers copy means copy here.
        if (0..g).rev().any(|i| known(i) == Some(Choice::ZeroCopy)) {
            return Choice::ZeroCopy;
        }
        if (g + 1..GROUPS).any(|i| known(i) == Some(Choice::Copy)) {
            return Choice::Copy;
        }
        if len < PRIOR_COPY_BELOW {
            Choice::Copy
        } else {
            Choice::ZeroCopy
        }
    }

    /// The thread's CPU clock, read before the send whose decision asked for it.
    pub(crate) fn clock(&mut self, now_ns: u64) {
        if let Some(w) = self.pending_close.take() {
            if !w.warmup && w.bytes > 0 {
                let start = w.start_ns.expect("filtered");
                let per_byte = now_ns.saturating_sub(start) as f64 / w.bytes as f64;
                self.groups[w.group].cost[idx(w.choice)].add(per_byte);
                self.stats.windows += 1;
                self.copy_below = self.learned_copy_below();
            }
        }
        if let Some(w) = self.win.as_mut() {
            if w.start_ns.is_none() {
                w.start_ns = Some(now_ns);
            }
        }
    }

    /// A zero-copy send completed with `status`; `probe` = it was a COPIED re-probe.
    #[cfg(test)]
    pub(crate) fn observe(&mut self, status: ZcStatus, probe: bool) -> Option<Event> {
        let ev = self.watch.observe(status, probe);
        match ev {
            Some(Event::SwitchedToCopy { .. }) => self.win = None,
            Some(Event::SwitchedBack) => self.last_choice = None,
            None => {}
        }
        self.sync_watch();
        ev
    }

    #[cfg(test)]
    fn sync_watch(&mut self) {
        let (to, re, back) = self.watch.counts();
        self.stats.switches_to_copy = to;
        self.stats.reprobes = re;
        self.stats.switches_back = back;
    }

    /// Whether COPIED completions put every size on copy.
    #[cfg(test)]
    pub(crate) fn in_copy(&self) -> bool {
        self.watch.in_copy()
    }

    /// The learned size below which copy is cheaper: the smallest size whose group (and
    /// every larger measured group) prefers zero-copy; 0 if nothing measured prefers copy
    /// (`None` before any group is measured on both paths).
    pub(crate) fn copy_below(&self) -> Option<usize> {
        self.copy_below
    }

    fn learned_copy_below(&self) -> Option<usize> {
        let mut any = false;
        let mut below = 0usize;
        for (i, g) in self.groups.iter().enumerate() {
            let c = g.cost;
            if c[0].samples >= MIN_SAMPLES && c[1].samples >= MIN_SAMPLES {
                any = true;
                if c[0].per_byte <= c[1].per_byte {
                    // Every size of group i (up to 2^i - 1... 2^i) is cheaper by copy.
                    below = below.max(1usize << i.min(usize::BITS as usize - 1));
                }
            }
        }
        any.then_some(below)
    }

    pub(crate) fn stats(&self) -> &PolicyStats {
        &self.stats
    }
}

fn other(c: Choice) -> Choice {
    match c {
        Choice::Copy => Choice::ZeroCopy,
        Choice::ZeroCopy => Choice::Copy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives `p` with sends of `len` whose CPU cost per byte is `copy`/`zc` ns; returns the
    /// choices made.
    fn run(
        p: &mut AutoPolicy,
        len: usize,
        copy: f64,
        zc: f64,
        n: usize,
        clock: &mut u64,
    ) -> Vec<Choice> {
        let mut out = Vec::new();
        for _ in 0..n {
            let d = p.decide(len);
            if d.clock {
                p.clock(*clock);
            }
            *clock += (len as f64 * if d.choice == Choice::Copy { copy } else { zc }) as u64;
            out.push(d.choice);
        }
        out
    }

    #[test]
    fn learns_copy_for_small_sends_and_zero_copy_for_large_ones() {
        let mut p = AutoPolicy::new(4, 4096, true);
        let mut t = 0;
        // 256 B: copy 2 ns/B, zero-copy 6 ns/B (notification cost dominates).
        let small = run(&mut p, 256, 2.0, 6.0, 20_000, &mut t);
        // 256 KiB: copy 0.3 ns/B, zero-copy 0.1 ns/B.
        let large = run(&mut p, 256 << 10, 0.3, 0.1, 20_000, &mut t);
        let zc_small = small[10_000..]
            .iter()
            .filter(|c| **c == Choice::ZeroCopy)
            .count();
        let copy_large = large[10_000..]
            .iter()
            .filter(|c| **c == Choice::Copy)
            .count();
        // Settled: the worse path only for re-measuring (two windows per gap).
        assert!(zc_small < 10_000 / 50, "{zc_small}");
        assert!(copy_large < 10_000 / 50, "{copy_large}");
        // Large windows end after 4 MiB: both sizes were measured on both paths.
        let g = |len: usize| p.groups[group_of(len)].cost;
        assert!(g(256)[0].samples >= MIN_SAMPLES && g(256)[1].samples >= MIN_SAMPLES);
        assert!(g(256 << 10)[0].samples >= MIN_SAMPLES && g(256 << 10)[1].samples >= MIN_SAMPLES);
        let below = p.copy_below().unwrap();
        assert!((256..256 << 10).contains(&below), "{below}");
        assert!(p.stats().size_copies > 0);
        assert!(p.stats().explores > 0);
    }

    #[test]
    fn relearns_when_costs_change() {
        let mut p = AutoPolicy::new(4, 4096, true);
        let mut t = 0;
        let a = run(&mut p, 16 << 10, 1.0, 0.5, 20_000, &mut t);
        assert_eq!(*a.last().unwrap(), Choice::ZeroCopy);
        // Now zero-copy got expensive (say, the route changed): back to copy.
        let b = run(&mut p, 16 << 10, 1.0, 3.0, 60_000, &mut t);
        let zc_late = b[40_000..]
            .iter()
            .filter(|c| **c == Choice::ZeroCopy)
            .count();
        assert!(zc_late < 20_000 / 20, "{zc_late}");
    }

    /// Like [`run`], counting clock reads and sends on each path.
    fn run_counted(
        p: &mut AutoPolicy,
        len: usize,
        cost: impl Fn(usize) -> (f64, f64),
        n: usize,
        clock: &mut u64,
    ) -> (u64, [u64; 2]) {
        let (mut clocks, mut on) = (0, [0u64; 2]);
        for i in 0..n {
            let d = p.decide(len);
            if d.clock {
                p.clock(*clock);
                clocks += 1;
            }
            let (copy, zc) = cost(i);
            *clock += (len as f64 * if d.choice == Choice::Copy { copy } else { zc }) as u64;
            on[idx(d.choice)] += 1;
        }
        (clocks, on)
    }

    #[test]
    fn alternating_sizes_read_the_clock_rarely_and_a_run_of_one_size_is_measured_again() {
        let mut p = AutoPolicy::new(4, 4096, true);
        let mut t = 0;
        // A proxy's shape: 100 B requests and 1 KiB answers, one each in turn (two groups):
        // every send starts a window that never fills.
        let mut clocks = 0u64;
        let n = 10_000u64;
        for i in 0..n {
            let len = if i % 2 == 0 { 100 } else { 1024 };
            let d = p.decide(len);
            if d.clock {
                p.clock(t);
                clocks += 1;
            }
            t += len as u64 * 2;
        }
        assert!(
            clocks <= n / u64::from(ABANDONED_CLOCK_EVERY) + 2,
            "{clocks} clock reads for {n} alternating sends"
        );
        assert_eq!(p.stats().windows, 0, "no window filled, none counted");
        // Then one size only: windows fill and are counted again.
        let (clocks, _) = run_counted(&mut p, 256, |_| (2.0, 6.0), 5_000, &mut t);
        assert!(p.stats().windows > 10, "{:?}", p.stats());
        assert!(
            clocks > 10 && clocks < 5_000 / u64::from(WINDOW) + 32,
            "{clocks}"
        );
        assert_eq!(p.groups[group_of(256)].chosen, Some(Choice::Copy));
    }

    #[test]
    fn settled_choice_stays_put_with_rare_brief_re_measuring_and_one_clock_read_per_long_window() {
        let mut p = AutoPolicy::new(4, 4096, true);
        let mut t = 0;
        // Converge (256 B: copy 2 ns/B, zero-copy 6 ns/B).
        run_counted(&mut p, 256, |_| (2.0, 6.0), 50_000, &mut t);
        assert_eq!(p.groups[group_of(256)].chosen, Some(Choice::Copy));
        let explores = p.stats().explores;
        // Steady: a million sends at constant cost.
        let n = 1_000_000;
        let (clocks, on) = run_counted(&mut p, 256, |_| (2.0, 6.0), n, &mut t);
        // The other path: a few brief re-measurements (gap doubling), well under 0.5 %.
        assert!(on[idx(Choice::ZeroCopy)] * 200 < n as u64, "{on:?}");
        assert!(p.stats().explores - explores <= 8, "{:?}", p.stats());
        assert_eq!(p.stats().drift_explores, 0, "no change, no change signal");
        // About one clock read per steady window of WINDOW * STEADY sends.
        let per = u64::from(WINDOW * STEADY);
        assert!(clocks < n as u64 / per + 64, "{clocks} clock reads");
        assert_eq!(p.copy_below(), Some(512));
    }

    #[test]
    fn chosen_path_getting_dearer_is_a_change_signal_that_re_learns_at_once() {
        let mut p = AutoPolicy::new(4, 4096, true);
        let mut t = 0;
        // Converge on zero-copy at 64 KiB and settle long enough for the gap to grow.
        run_counted(&mut p, 64 << 10, |_| (0.3, 0.1), 200_000, &mut t);
        assert_eq!(p.groups[group_of(64 << 10)].chosen, Some(Choice::ZeroCopy));
        let gap = p.groups[group_of(64 << 10)].gap;
        assert!(gap > GAP_MIN * 4, "gap {gap}");
        // The route changes: zero-copy now costs 5× what it did, copy is unchanged.
        let (_, on) = run_counted(&mut p, 64 << 10, |_| (0.3, 0.5), 3_000, &mut t);
        assert!(p.stats().drift_explores >= 1, "{:?}", p.stats());
        assert_eq!(p.groups[group_of(64 << 10)].chosen, Some(Choice::Copy));
        // Switched within a few steady windows, not after the grown gap (`gap` windows of
        // WINDOW * STEADY sends each).
        let grown = u64::from(gap * WINDOW * STEADY);
        assert!(
            on[idx(Choice::ZeroCopy)] < 6 * u64::from(WINDOW * STEADY),
            "{on:?}"
        );
        assert!(on[idx(Choice::ZeroCopy)] * 10 < grown, "{on:?} vs {grown}");
        assert_eq!(p.copy_below(), Some(128 << 10));
    }

    #[test]
    fn unmeasured_sizes_follow_the_learned_threshold() {
        let mut p = AutoPolicy::new(4, 4096, true);
        let mut t = 0;
        run(&mut p, 2 << 10, 1.0, 2.0, 5_000, &mut t);
        run(&mut p, 64 << 10, 1.0, 0.3, 5_000, &mut t);
        assert_eq!(p.estimate(group_of(1 << 10), 1 << 10), Choice::Copy);
        assert_eq!(p.estimate(group_of(1 << 20), 1 << 20), Choice::ZeroCopy);
    }

    #[test]
    fn copied_streak_switches_everything_to_copy_and_a_good_probe_switches_back() {
        let mut p = AutoPolicy::new(3, 10, false);
        assert_eq!(p.decide(1 << 20).choice, Choice::ZeroCopy);
        assert_eq!(p.observe(ZcStatus::Copied, false), None);
        assert_eq!(p.observe(ZcStatus::Copied, false), None);
        assert!(matches!(
            p.observe(ZcStatus::Copied, false),
            Some(Event::SwitchedToCopy { streak: 3, .. })
        ));
        let ds: Vec<_> = (0..10).map(|_| p.decide(1 << 20)).collect();
        assert!(ds[..9].iter().all(|d| d.choice == Choice::Copy));
        assert!(ds[9].probe && ds[9].choice == Choice::ZeroCopy);
        // A copied probe doubles the interval.
        assert_eq!(p.observe(ZcStatus::Copied, true), None);
        let ds: Vec<_> = (0..20).map(|_| p.decide(1 << 20)).collect();
        assert_eq!(ds.iter().filter(|d| d.probe).count(), 1);
        assert!(ds[19].probe);
        assert_eq!(
            p.observe(ZcStatus::ZeroCopy, true),
            Some(Event::SwitchedBack)
        );
        assert!(!p.in_copy());
        assert_eq!(p.stats().reprobes, 2);
    }

    #[test]
    fn unknown_usage_never_counts_as_copied_or_zero_copy() {
        let mut p = AutoPolicy::new(2, 10, false);
        for _ in 0..10 {
            assert_eq!(p.observe(ZcStatus::Unknown, false), None);
        }
        assert!(!p.in_copy());
    }
}
