//! `MSG_ZEROCOPY` sequence numbers → buffers.
//!
//! Every `send(MSG_ZEROCOPY)` call that the kernel accepts takes the socket's next u32
//! sequence number (`sk_zckey`); completions name inclusive ranges `[lo, hi]` of them, in any
//! order, and the counter wraps. [`IdTracker`] keeps a window of outstanding numbers starting
//! at the oldest one still outstanding, each mapped to the slot (buffer) that issued it.

use crate::sys::errqueue::ZcRange;
use std::collections::VecDeque;

/// Outstanding `MSG_ZEROCOPY` sequence numbers and the slot each belongs to.
#[derive(Debug)]
pub(crate) struct IdTracker {
    base: u32,
    window: VecDeque<Option<u32>>,
    outstanding: usize,
}

impl IdTracker {
    /// A tracker whose first send gets sequence number `first` (0 on a fresh socket).
    pub(crate) fn new(first: u32) -> Self {
        Self {
            base: first,
            window: VecDeque::new(),
            outstanding: 0,
        }
    }

    /// The number the next accepted send will get.
    pub(crate) fn next_id(&self) -> u32 {
        self.base.wrapping_add(self.window.len() as u32)
    }

    /// Records that the next sequence number belongs to `slot`; returns the number.
    pub(crate) fn push(&mut self, slot: u32) -> u32 {
        let id = self.next_id();
        self.window.push_back(Some(slot));
        self.outstanding += 1;
        id
    }

    /// The oldest outstanding sequence number (meaningful when `outstanding() > 0`).
    pub(crate) fn oldest(&self) -> u32 {
        self.base
    }

    /// Sequence numbers issued and not yet completed.
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Applies a completion range: calls `f(slot)` once per outstanding number in it and
    /// returns how many numbers of the range were not outstanding (never issued, or
    /// completed twice): these are reported, never matched to a buffer.
    pub(crate) fn complete(&mut self, r: ZcRange, mut f: impl FnMut(u32)) -> u64 {
        let mut unknown = 0;
        let len = self.window.len() as u64;
        for k in 0..r.len() {
            let id = r.lo.wrapping_add(k as u32);
            let pos = u64::from(id.wrapping_sub(self.base));
            match self.window.get_mut(pos as usize).filter(|_| pos < len) {
                Some(e @ Some(_)) => {
                    f(e.take().expect("matched Some"));
                    self.outstanding -= 1;
                }
                _ => unknown += 1,
            }
        }
        while let Some(None) = self.window.front() {
            self.window.pop_front();
            self.base = self.base.wrapping_add(1);
        }
        unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(lo: u32, hi: u32) -> ZcRange {
        ZcRange {
            lo,
            hi,
            copied: false,
        }
    }

    #[test]
    fn ranges_map_to_the_slots_that_issued_them() {
        let mut t = IdTracker::new(0);
        for slot in [7, 7, 8, 9] {
            t.push(slot);
        }
        let mut got = vec![];
        assert_eq!(t.complete(range(0, 1), |s| got.push(s)), 0);
        assert_eq!(got, vec![7, 7]);
        assert_eq!(t.outstanding(), 2);
        assert_eq!(t.next_id(), 4);
    }

    #[test]
    fn out_of_order_ranges_complete_each_number_once() {
        let mut t = IdTracker::new(100);
        for slot in 0..6 {
            t.push(slot);
        }
        let mut got = vec![];
        t.complete(range(103, 104), |s| got.push(s));
        t.complete(range(101, 101), |s| got.push(s));
        assert_eq!(got, vec![3, 4, 1]);
        // The window cannot advance past 100 yet.
        assert_eq!(t.outstanding(), 3);
        t.complete(range(100, 100), |s| got.push(s));
        t.complete(range(102, 102), |s| got.push(s));
        t.complete(range(105, 105), |s| got.push(s));
        assert_eq!(got, vec![3, 4, 1, 0, 2, 5]);
        assert_eq!(t.outstanding(), 0);
        // Repeats and never-issued numbers are counted, not matched.
        assert_eq!(t.complete(range(104, 107), |_| panic!("no slot")), 4);
        assert_eq!(t.next_id(), 106);
    }

    #[test]
    fn counter_wrap_is_followed() {
        let mut t = IdTracker::new(u32::MAX - 2);
        for slot in 0..6 {
            t.push(slot);
        }
        assert_eq!(t.next_id(), 3);
        let mut got = vec![];
        // One range across the wrap: MAX-1, MAX, 0, 1.
        t.complete(range(u32::MAX - 1, 1), |s| got.push(s));
        assert_eq!(got, vec![1, 2, 3, 4]);
        t.complete(range(2, 2), |s| got.push(s));
        t.complete(range(u32::MAX - 2, u32::MAX - 2), |s| got.push(s));
        assert_eq!(got, vec![1, 2, 3, 4, 5, 0]);
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.next_id(), 3);
        t.push(9);
        let mut last = vec![];
        t.complete(range(3, 3), |s| last.push(s));
        assert_eq!(last, vec![9]);
    }
}
