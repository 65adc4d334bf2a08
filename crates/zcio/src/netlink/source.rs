//! The producers of the netlink frame ring: [`FrameSource`] owns a [`FrameRing`] (memory and
//! frame states, `buf::frames`) and fills it from a netlink socket, with one of two producers
//! chosen once:
//!
//! - `recvmmsg(2)`: up to [`MAX_BATCH`] free frames per syscall. Each datagram gets a second
//!   iovec into a per-slot spill area, so a datagram longer than a frame is not lost: it
//!   becomes a `COPY` frame;
//! - io_uring ([`FrameRecv`], `ring::recv`): a multishot `RECV` picks frames from a
//!   provided-buffer ring; a window of [`URING_WINDOW`] frames is lent at a time, topped up
//!   from the free stack before each wait. Verdict sends ride the same ring.
//!
//! This module makes its syscalls through `sys` and `ring` and holds no `unsafe`.

use crate::buf::frames::{FrameId, FrameRing, FrameStatus};
use crate::ring::recv::{FrameEvent, FrameRecv};
use crate::sys::netlink::{self as nl, Received};
use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Most frames one `recvmmsg` fills.
pub(crate) const MAX_BATCH: usize = nl::RECV_SPLIT_MAX;

/// Frames lent to the kernel at a time in io_uring mode (the rest wait on the LIFO stack).
const URING_WINDOW: u32 = 64;

/// What one [`FrameSource::fill`] did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fill {
    /// Frames that became VALID or COPY.
    pub(crate) frames: usize,
    /// The kernel reported an overrun (ENOBUFS): messages were lost before this receive.
    pub(crate) overrun: bool,
    /// No frame was free (all ready or held); nothing was received.
    pub(crate) full: bool,
}

/// Errors filling the frame ring.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Every frame is held (SKIP): release some before receiving more.
    #[error("all {0} frames are held (SKIP); release held frames before receiving more")]
    AllHeld(u32),
    /// The receive failed.
    #[error("receiving on the netlink socket: {0}")]
    Io(#[from] io::Error),
}

/// Counters of a frame ring's producer.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct FrameStats {
    /// Receive syscalls made.
    pub syscalls: u64,
    /// Datagrams received into frames.
    pub frames: u64,
    /// Of those, datagrams larger than a frame (COPY).
    pub copies: u64,
    /// Datagrams larger than frame + spill: cut short (reported, payload incomplete).
    pub truncated: u64,
    /// Kernel overruns (ENOBUFS) seen.
    pub overruns: u64,
    /// Fills that found every frame taken.
    pub full: u64,
}

impl FrameStats {
    /// The counters accumulated since `before`.
    pub(crate) fn since(&self, before: &FrameStats) -> FrameStats {
        FrameStats {
            syscalls: self.syscalls - before.syscalls,
            frames: self.frames - before.frames,
            copies: self.copies - before.copies,
            truncated: self.truncated - before.truncated,
            overruns: self.overruns - before.overruns,
            full: self.full - before.full,
        }
    }
}

/// The `recvmmsg` producer's per-slot spill area.
#[derive(Debug)]
struct Spill {
    /// `size` bytes per batch slot; from calloc, so untouched pages are never backed.
    area: Vec<u8>,
    size: usize,
}

// One per socket, so its size does not matter; boxing the ring would add a pointer chase to
// every fill.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Producer {
    Recvmmsg(Spill),
    Uring(FrameRecv),
}

/// A frame ring and the producer that fills it from a netlink socket. See the module docs.
#[derive(Debug)]
pub(crate) struct FrameSource {
    // Declared first, so dropped first: in io_uring mode the receive is cancelled and the
    // buffer ring unregistered before the frames go. (`FrameRecv` also keeps the frame memory
    // mapped itself until then, so this order is belt and braces, not the only guarantee.)
    producer: Producer,
    frames: FrameRing,
    stats: FrameStats,
    /// io_uring mode: completions to gather per wait and how long to hold the first back.
    batch: Option<(usize, Duration)>,
}

impl FrameSource {
    /// `count` frames of `frame_size` bytes (header included; rounded up to 16), filled by
    /// `recvmmsg`. Datagrams up to `frame_size - 16 + spill` bytes are received whole.
    pub(crate) fn new(frame_size: usize, count: u32, spill: usize) -> io::Result<Self> {
        let frames = FrameRing::new(frame_size, count)?;
        let size = spill.max(1);
        let batch = MAX_BATCH.min(count as usize);
        Ok(Self {
            producer: Producer::Recvmmsg(Spill {
                // vec![0; n] comes from calloc: untouched pages are never backed.
                area: vec![0u8; size * batch],
                size,
            }),
            frames,
            stats: FrameStats::default(),
            batch: None,
        })
    }

    /// In io_uring mode, lets a wait gather up to `n` completions, holding the first back at
    /// most `min_wait` (see [`FrameRecv::wait`]). Fails, saying why, outside io_uring mode or
    /// where the kernel cannot (Linux 6.12); waits then return on the first completion. `n`
    /// is capped at what one fill takes ([`MAX_BATCH`]): a larger `n` could never be met, and
    /// every wait would last the whole `min_wait` however fast datagrams came.
    pub(crate) fn set_batch_wait(&mut self, n: usize, min_wait: Duration) -> Result<(), String> {
        match &self.producer {
            Producer::Uring(u) if u.has_min_wait() => {
                self.batch = Some((n.min(MAX_BATCH), min_wait));
                Ok(())
            }
            Producer::Uring(_) => Err("kernel lacks IORING_FEAT_MIN_TIMEOUT (Linux 6.12)".into()),
            Producer::Recvmmsg(_) => {
                Err("recvmmsg waits with poll(2), which cannot gather a batch".into())
            }
        }
    }

    /// The frames (consumer side: [`FrameRing::pop_ready`], [`FrameRing::data`], …).
    pub(crate) fn frames(&self) -> &FrameRing {
        &self.frames
    }

    /// The frames, mutably (to pop, hold and release them).
    pub(crate) fn frames_mut(&mut self) -> &mut FrameRing {
        &mut self.frames
    }

    /// Counters.
    pub(crate) fn stats(&self) -> FrameStats {
        self.stats
    }

    /// Whether frames are filled by io_uring multishot receive.
    pub(crate) fn is_uring(&self) -> bool {
        matches!(self.producer, Producer::Uring(_))
    }

    /// Switches the producer to io_uring: a multishot `recv` on the socket picks frames from a
    /// provided-buffer ring ([`FrameRecv`]). On error the source stays in `recvmmsg` mode and
    /// the error says why. Datagrams larger than a frame cannot spill here: size frames for
    /// the largest datagram (the caller clamps the nfqueue copy range).
    pub(crate) fn enable_uring(&mut self) -> Result<(), String> {
        if self.is_uring() {
            return Ok(());
        }
        let u = FrameRecv::new(self.frames.count(), self.frames.memory())?;
        self.producer = Producer::Uring(u);
        self.top_up();
        Ok(())
    }

    /// Puts a datagram received some other way into a free frame (see [`FrameRing::inject`]),
    /// counted like a received one. Returns `false` when no frame is free.
    pub(crate) fn inject(&mut self, data: &[u8]) -> bool {
        match self.frames.inject(data) {
            Some(st) => {
                self.stats.frames += 1;
                if st == FrameStatus::Copy {
                    self.stats.copies += 1;
                }
                true
            }
            None => false,
        }
    }

    /// Receives up to `max` datagrams from `fd` into free frames: one `io_uring_enter` that
    /// harvests the multishot receive's completions (io_uring mode), or one `recvmmsg`.
    /// Waits up to `wait` when nothing is ready (`Duration::ZERO`: never; `Duration::MAX`:
    /// forever). Held frames are skipped; fails only when every frame is held.
    pub(crate) fn fill(
        &mut self,
        fd: &impl AsRawFd,
        max: usize,
        wait: Duration,
    ) -> Result<Fill, FrameError> {
        // Frames released while pinned come back once their pins are gone.
        self.frames.reclaim();
        if self.frames.all_held() {
            return Err(FrameError::AllHeld(self.frames.count()));
        }
        if self.is_uring() {
            return self.fill_uring(fd, wait);
        }
        if wait == Duration::MAX {
            return self.fill_recvmmsg(fd, max, true);
        }
        let f = self.fill_recvmmsg(fd, max, false)?;
        if f.frames > 0 || f.full || f.overrun || wait.is_zero() {
            return Ok(f);
        }
        self.stats.syscalls += 1;
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        if crate::sys::net::poll_one(fd, libc::POLLIN, ms.max(1))? == 0 {
            return Ok(f);
        }
        self.fill_recvmmsg(fd, max, false)
    }

    fn fill_recvmmsg(
        &mut self,
        fd: &impl AsRawFd,
        max: usize,
        wait: bool,
    ) -> Result<Fill, FrameError> {
        let mut fill = Fill::default();
        let Producer::Recvmmsg(spill) = &mut self.producer else {
            return Ok(fill);
        };
        if self.frames.free() == 0 {
            if self.frames.all_held() {
                return Err(FrameError::AllHeld(self.frames.count()));
            }
            self.stats.full += 1;
            fill.full = true;
            return Ok(fill);
        }
        let want = max.clamp(1, MAX_BATCH);
        let mut ids = [0u32; MAX_BATCH];
        let mut got = [Received::default(); MAX_BATCH];
        let flags = if wait {
            libc::MSG_WAITFORONE
        } else {
            libc::MSG_DONTWAIT
        };
        let res = {
            let mut iov: [[IoSliceMut<'_>; 2]; MAX_BATCH] =
                std::array::from_fn(|_| [IoSliceMut::new(&mut []), IoSliceMut::new(&mut [])]);
            // The most recently released frames (still in cache) first; slot `i` spills into
            // `spill.area[i * size..]`.
            let n = self
                .frames
                .reserve(&mut ids[..want], |i, p| iov[i][0] = IoSliceMut::new(p));
            for (slot, s) in iov[..n].iter_mut().zip(spill.area.chunks_mut(spill.size)) {
                slot[1] = IoSliceMut::new(s);
            }
            self.stats.syscalls += 1;
            (n, nl::recv_split(fd, &mut iov[..n], &mut got[..n], flags))
        };
        let (n, res) = res;
        let k = match res {
            Ok(k) => k,
            Err(e) => {
                self.frames.unreserve(&ids[..n]);
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(fill),
                    Some(libc::ENOBUFS) => {
                        self.stats.overruns += 1;
                        fill.overrun = true;
                        Ok(fill)
                    }
                    _ => Err(FrameError::Io(e)),
                };
            }
        };
        for (i, (&id, r)) in ids[..k].iter().zip(&got[..k]).enumerate() {
            if r.flags & libc::MSG_TRUNC as u32 != 0 {
                self.stats.truncated += 1;
            }
            let s = &spill.area[i * spill.size..(i + 1) * spill.size];
            if self.frames.complete(FrameId(id), r.len, r.flags, s) == Some(FrameStatus::Copy) {
                self.stats.copies += 1;
            }
        }
        // Frames not filled go back on top in their original order.
        self.frames.unreserve(&ids[k..n]);
        self.stats.frames += k as u64;
        fill.frames = k;
        Ok(fill)
    }

    /// Frames kept in the kernel's buffer ring in io_uring mode.
    fn uring_window(&self) -> u32 {
        self.frames.count().min(URING_WINDOW)
    }

    /// Lends frames from the top of the free stack until the window is full, and publishes
    /// them with one `advance`.
    fn top_up(&mut self) {
        let window = self.uring_window();
        let Producer::Uring(u) = &mut self.producer else {
            return;
        };
        while u.provided() < window {
            let Some(f) = self.frames.lend() else {
                break;
            };
            u.provide(f);
        }
        u.publish();
    }

    fn fill_uring(&mut self, fd: &impl AsRawFd, wait: Duration) -> Result<Fill, FrameError> {
        let deadline = (wait != Duration::MAX).then(|| Instant::now() + wait);
        let mut w = wait;
        loop {
            let f = self.fill_uring_once(fd, w)?;
            if f.frames > 0 || f.full || f.overrun || wait.is_zero() {
                return Ok(f);
            }
            // Only other completions (verdict sends) ended the wait: keep waiting for data.
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Ok(f);
                }
                w = d - now;
            }
        }
    }

    fn fill_uring_once(&mut self, fd: &impl AsRawFd, wait: Duration) -> Result<Fill, FrameError> {
        let mut fill = Fill::default();
        self.top_up();
        let Producer::Uring(u) = &mut self.producer else {
            return Ok(fill);
        };
        if !u.armed() && u.provided() == 0 {
            // Every frame is ready or held: nothing to receive into.
            self.stats.full += 1;
            fill.full = true;
            return Ok(fill);
        }
        let before = u.enters();
        let mut err = None;
        let (frames, stats) = (&mut self.frames, &mut self.stats);
        let payload = frames.frame_payload();
        let r = u.wait(fd, wait, self.batch, |ev| match ev {
            FrameEvent::Data { bid, len } => {
                if frames
                    .complete(FrameId(u32::from(bid)), len as usize, 0, &[])
                    .is_none()
                {
                    // Not a frame this ring lent: ignore it.
                    return;
                }
                if len as usize >= payload {
                    // A full frame may be a cut datagram: the parser will see a short message.
                    stats.truncated += 1;
                }
                stats.frames += 1;
                fill.frames += 1;
            }
            FrameEvent::Dry => {
                stats.full += 1;
                fill.full = true;
            }
            FrameEvent::Overrun => {
                stats.overruns += 1;
                fill.overrun = true;
            }
            FrameEvent::Error(e) => {
                err.get_or_insert(e);
            }
        });
        self.stats.syscalls += u.enters() - before;
        r?;
        if let Some(e) = err {
            if fill.frames == 0 {
                return Err(FrameError::Io(e));
            }
        }
        Ok(fill)
    }

    /// In io_uring mode: queues `buf` (whole netlink messages for the kernel) as a send on
    /// `fd` ([`FrameRecv::queue_send`]); its result comes back under `token` from
    /// [`FrameSource::take_send_results`]. Outside io_uring mode, or when the submission
    /// queue is full, the buffer comes back as `Err`.
    pub(crate) fn queue_send(
        &mut self,
        fd: &impl AsRawFd,
        buf: Vec<u8>,
        token: u64,
    ) -> Result<(), Vec<u8>> {
        match &mut self.producer {
            Producer::Uring(u) => u.queue_send(fd, buf, token),
            Producer::Recvmmsg(_) => Err(buf),
        }
    }

    /// Submits queued sends now (no syscall when none are queued).
    pub(crate) fn submit_sends(&mut self) -> io::Result<()> {
        if let Producer::Uring(u) = &mut self.producer {
            let before = u.enters();
            u.submit_sends()?;
            self.stats.syscalls += u.enters() - before;
        }
        Ok(())
    }

    /// An empty buffer for the next send (recycled from completed sends when possible).
    pub(crate) fn spare_send_buf(&mut self) -> Vec<u8> {
        match &mut self.producer {
            Producer::Uring(u) => u.spare_send_buf(),
            Producer::Recvmmsg(_) => Vec::with_capacity(4096),
        }
    }

    /// Results of the sends completed since the last call, appended to `out` as
    /// `(token, result)`; a short send is an error (a netlink datagram goes whole or not).
    pub(crate) fn take_send_results(&mut self, out: &mut Vec<(u64, io::Result<()>)>) {
        if let Producer::Uring(u) = &mut self.producer {
            u.take_send_results(out);
        }
    }

    /// Sends queued or submitted whose completion has not been harvested yet.
    #[cfg_attr(not(test), allow(dead_code))] // NfQueue reads results, not the count
    pub(crate) fn sends_outstanding(&self) -> usize {
        match &self.producer {
            Producer::Uring(u) => u.sends_outstanding(),
            Producer::Recvmmsg(_) => 0,
        }
    }

    /// The io_uring producer, when in use (for its readiness eventfd).
    pub(crate) fn uring_mut(&mut self) -> Option<&mut FrameRecv> {
        match &mut self.producer {
            Producer::Uring(u) => Some(u),
            Producer::Recvmmsg(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    fn pair() -> (UnixDatagram, UnixDatagram) {
        UnixDatagram::pair().unwrap()
    }

    #[test]
    fn a_datagram_longer_than_a_frame_arrives_whole_as_a_copy_frame() {
        let (a, b) = pair();
        let mut src = FrameSource::new(4096, 4, 8192).unwrap();
        let big: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        b.send(&[1, 2, 3]).unwrap();
        b.send(&big).unwrap();
        let f = src.fill(&a, 64, Duration::from_secs(2)).unwrap();
        assert_eq!(f.frames, 2);
        let st = src.stats();
        assert_eq!((st.frames, st.copies, st.truncated), (2, 1, 0));
        assert_eq!(st.syscalls, 1, "one recvmmsg for both");
        let r = src.frames_mut();
        let x = r.pop_ready().unwrap();
        assert_eq!(r.data(x), &[1, 2, 3]);
        let y = r.pop_ready().unwrap();
        assert_eq!(r.status(y), FrameStatus::Copy);
        assert_eq!(r.data(y), &big[..]);
        r.release(x);
        r.release(y);
        assert_eq!(r.free(), 4);
    }

    #[test]
    fn a_full_ring_reports_full_and_all_held_only_when_every_frame_is_held() {
        let (a, b) = pair();
        let mut src = FrameSource::new(256, 2, 256).unwrap();
        for i in 0..3u8 {
            b.send(&[i]).unwrap();
        }
        assert_eq!(src.fill(&a, 64, Duration::ZERO).unwrap().frames, 2);
        // Both frames ready, none free: full, nothing received.
        let f = src.fill(&a, 64, Duration::ZERO).unwrap();
        assert!(f.full && f.frames == 0);
        assert_eq!(src.stats().full, 1);
        let r = src.frames_mut();
        let (x, y) = (r.pop_ready().unwrap(), r.pop_ready().unwrap());
        r.hold(x);
        r.hold(y);
        assert!(matches!(
            src.fill(&a, 64, Duration::ZERO),
            Err(FrameError::AllHeld(2))
        ));
        src.frames_mut().release(y);
        let f = src.fill(&a, 64, Duration::ZERO).unwrap();
        assert_eq!(f.frames, 1);
        let z = src.frames_mut().pop_ready().unwrap();
        assert_eq!(z, y, "the released frame is reused");
        assert_eq!(src.frames().data(z), &[2]);
    }

    #[test]
    fn a_bounded_wait_returns_empty_after_about_its_timeout() {
        let (a, _b) = pair();
        let mut src = FrameSource::new(256, 2, 256).unwrap();
        let t = Instant::now();
        let f = src.fill(&a, 64, Duration::from_millis(30)).unwrap();
        assert_eq!(f.frames, 0);
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "{:?}",
            t.elapsed()
        );
        // recvmmsg, poll.
        assert_eq!(src.stats().syscalls, 2);
    }

    #[test]
    fn uring_fills_frames_and_sends_ride_the_ring() {
        let (a, b) = pair();
        let mut src = FrameSource::new(4096, 4, 4096).unwrap();
        src.enable_uring()
            .expect("io_uring multishot recv on a unix socket");
        assert!(src.is_uring());
        let buf = {
            let mut v = src.spare_send_buf();
            v.extend_from_slice(b"verdicts");
            v
        };
        src.queue_send(&a, buf, 7).unwrap();
        assert_eq!(src.sends_outstanding(), 1);
        b.send(b"packet").unwrap();
        let end = Instant::now() + Duration::from_secs(2);
        let mut frames = 0;
        let mut results = Vec::new();
        while (frames == 0 || results.is_empty()) && Instant::now() < end {
            frames += src.fill(&a, 64, Duration::from_millis(50)).unwrap().frames;
            src.take_send_results(&mut results);
        }
        assert_eq!(frames, 1);
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].0, 7);
        assert!(results[0].1.is_ok());
        assert_eq!(src.sends_outstanding(), 0);
        let id = src.frames_mut().pop_ready().unwrap();
        assert_eq!(src.frames().data(id), b"packet");
        let mut got = [0u8; 16];
        assert_eq!(b.recv(&mut got).unwrap(), 8);
        assert_eq!(&got[..8], b"verdicts");
    }
}
