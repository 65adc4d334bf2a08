//! One typed user_data codec for every ring in the crate.
//!
//! A request's user_data is a [`Key`]: the top four bits say what the request is ([`Op`]), the
//! other 60 bits carry that kind's fields. Fields are packed and unpacked only here, so no ring
//! shifts bits by hand and two kinds can never be confused (a poll's completion cannot be taken
//! for a send's, whatever its fields hold).
//!
//! | op | fields (low 60 bits) |
//! |---|---|
//! | [`Op::SendZc`] | generation (12 bits) · lent buffer (24) · request number within the buffer's use (24) |
//! | [`Op::Send`] | slot (60) |
//! | [`Op::Recv`], [`Op::RecvZc`], [`Op::Accept`] | the caller's tag (60) |
//! | [`Op::Poll`], [`Op::PollUpdate`] | generation (28) · fd (32) |
//! | [`Op::Cancel`] | nothing |
//! | [`Op::Internal`] | a ring-private tag (60) |

use std::os::fd::RawFd;

const OP_SHIFT: u32 = 60;
const FIELDS: u64 = (1 << OP_SHIFT) - 1;

/// Largest tag a [`Key::tagged`] or [`Key::internal`] key carries.
pub const MAX_TAG: u64 = FIELDS;
/// Generations of a lent send buffer wrap at this mask (12 bits).
pub const SEND_GEN_MASK: u16 = (1 << 12) - 1;
/// Lent send buffers are numbered below this (24 bits: 16 M in flight per ring).
pub const SEND_SLOTS: u32 = 1 << 24;
/// Request numbers within one use of a lent buffer wrap at this mask (24 bits).
pub const SEND_REQ_MASK: u32 = (1 << 24) - 1;
/// Generations of a poll registration wrap at this mask (28 bits).
pub const POLL_GEN_MASK: u32 = (1 << 28) - 1;

/// What a request is: the top four bits of its user_data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// A send from a lent buffer (`SEND_ZC`, `SEND`, `SENDMSG_ZC`): its result CQE and, for
    /// zero-copy, its notification CQE.
    SendZc = 1,
    /// A plain send (netlink verdicts).
    Send = 2,
    /// A (multishot) receive into provided buffers.
    Recv = 3,
    /// A multishot zcrx receive (`RECV_ZC`).
    RecvZc = 4,
    /// A multishot accept.
    Accept = 5,
    /// A readiness poll (`POLL_ADD`).
    Poll = 6,
    /// A `POLL_UPDATE` aimed at the poll with the same fields.
    PollUpdate = 7,
    /// A cancel request; its own completion carries nothing to route.
    Cancel = 8,
    /// A ring-private request (a wake-up poll, …).
    Internal = 9,
}

impl Op {
    fn from_bits(b: u64) -> Option<Op> {
        Some(match b {
            1 => Op::SendZc,
            2 => Op::Send,
            3 => Op::Recv,
            4 => Op::RecvZc,
            5 => Op::Accept,
            6 => Op::Poll,
            7 => Op::PollUpdate,
            8 => Op::Cancel,
            9 => Op::Internal,
            _ => return None,
        })
    }
}

/// A typed user_data value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u64);

impl Key {
    const fn with(op: Op, fields: u64) -> Key {
        Key(((op as u64) << OP_SHIFT) | (fields & FIELDS))
    }

    /// The key of a request sending from a lent buffer: the buffer's generation (masked to
    /// [`SEND_GEN_MASK`]), the buffer's number (below [`SEND_SLOTS`]) and the request's
    /// number within that use of the buffer (masked to [`SEND_REQ_MASK`]; the send tracker
    /// maps it to the bytes it covers).
    pub const fn send_zc(gen: u16, slot: u32, req: u32) -> Key {
        let gen = (gen & SEND_GEN_MASK) as u64;
        let slot = (slot & (SEND_SLOTS - 1)) as u64;
        Key::with(
            Op::SendZc,
            (gen << 48) | (slot << 24) | (req & SEND_REQ_MASK) as u64,
        )
    }

    /// `(generation, buffer, request number)` of a [`Op::SendZc`] key.
    pub const fn send_zc_parts(self) -> (u16, u32, u32) {
        (
            ((self.0 >> 48) as u16) & SEND_GEN_MASK,
            ((self.0 >> 24) as u32) & (SEND_SLOTS - 1),
            (self.0 as u32) & SEND_REQ_MASK,
        )
    }

    /// The key of a plain send from `slot`.
    pub const fn send(slot: usize) -> Key {
        Key::with(Op::Send, slot as u64)
    }

    /// A key carrying a caller's tag (at most [`MAX_TAG`]; larger tags are refused by the
    /// callers that take them from users).
    pub const fn tagged(op: Op, tag: u64) -> Key {
        Key::with(op, tag)
    }

    /// The key of a poll on `fd` for registration generation `gen` (masked to
    /// [`POLL_GEN_MASK`]).
    pub const fn poll(fd: RawFd, gen: u32) -> Key {
        Key::with(
            Op::Poll,
            (((gen & POLL_GEN_MASK) as u64) << 32) | fd as u32 as u64,
        )
    }

    /// The key of a `POLL_UPDATE` of the poll `target`: same fields, its own op.
    pub const fn poll_update(target: Key) -> Key {
        Key::with(Op::PollUpdate, target.0)
    }

    /// `(fd, generation)` of a [`Op::Poll`] or [`Op::PollUpdate`] key.
    pub const fn poll_parts(self) -> (RawFd, u32) {
        (
            self.0 as u32 as RawFd,
            (self.0 >> 32) as u32 & POLL_GEN_MASK,
        )
    }

    /// The key of a cancel request.
    pub const fn cancel() -> Key {
        Key::with(Op::Cancel, 0)
    }

    /// A ring-private key with its own tag.
    pub const fn internal(tag: u64) -> Key {
        Key::with(Op::Internal, tag)
    }

    /// What the request is; `None` for a value no zcio ring produced.
    pub fn op(self) -> Option<Op> {
        Op::from_bits(self.0 >> OP_SHIFT)
    }

    /// The 60 field bits: the tag of a tagged or internal key, the slot of a plain send.
    pub const fn tag(self) -> u64 {
        self.0 & FIELDS
    }

    /// The raw user_data value.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The key of a completion's user_data.
    pub const fn from_raw(ud: u64) -> Key {
        Key(ud)
    }
}

impl From<Key> for u64 {
    fn from(k: Key) -> u64 {
        k.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_its_fields() {
        let k = Key::send_zc(0xabc, 0xff_ffff, 0xad_beef);
        assert_eq!(k.op(), Some(Op::SendZc));
        assert_eq!(k.send_zc_parts(), (0xabc, 0xff_ffff, 0xad_beef));
        // Request numbers wrap inside their field, never into the buffer's.
        assert_eq!(
            Key::send_zc(1, 2, 0x1ff_ffff).send_zc_parts(),
            (1, 2, 0xff_ffff)
        );
        let k = Key::send(12345);
        assert_eq!((k.op(), k.tag()), (Some(Op::Send), 12345));
        for op in [Op::Recv, Op::RecvZc, Op::Accept] {
            let k = Key::tagged(op, MAX_TAG);
            assert_eq!((k.op(), k.tag()), (Some(op), MAX_TAG));
        }
        let k = Key::poll(1_000_000, POLL_GEN_MASK);
        assert_eq!(k.op(), Some(Op::Poll));
        assert_eq!(k.poll_parts(), (1_000_000, POLL_GEN_MASK));
        let u = Key::poll_update(k);
        assert_eq!(u.op(), Some(Op::PollUpdate));
        assert_eq!(u.poll_parts(), k.poll_parts());
        assert_eq!(Key::cancel().op(), Some(Op::Cancel));
        assert_eq!(Key::internal(7).op(), Some(Op::Internal));
        assert_eq!(Key::from_raw(Key::internal(7).raw()), Key::internal(7));
    }

    #[test]
    fn generations_wrap_inside_their_field() {
        // A generation past its mask must not spill into the op bits.
        let k = Key::send_zc(u16::MAX, 1, 2);
        assert_eq!(k.op(), Some(Op::SendZc));
        assert_eq!(k.send_zc_parts().0, SEND_GEN_MASK);
        let k = Key::poll(3, u32::MAX);
        assert_eq!(k.op(), Some(Op::Poll));
        assert_eq!(k.poll_parts(), (3, POLL_GEN_MASK));
    }

    #[test]
    fn values_no_ring_made_have_no_op() {
        assert_eq!(Key::from_raw(0).op(), None);
        assert_eq!(Key::from_raw(u64::MAX).op(), None);
        assert_eq!(Key::from_raw(1).op(), None);
    }
}
