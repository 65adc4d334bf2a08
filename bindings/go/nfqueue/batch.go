package nfqueue

/*
#include <zcio.h>
*/
import "C"

import (
	"context"
	"errors"
	"runtime/debug"
	"time"
	"unsafe"
)

// Packet is one packet of a Batch. Payload points into zcio's frame ring: valid until the
// packet's verdict (see the package comment).
type Packet struct {
	ID         uint32
	Queue      uint16
	HwProtocol uint16
	Hook       uint8
	Family     uint8
	// Mark and whether the kernel sent one.
	Mark    uint32
	HasMark bool
	// Interface indexes (0: none).
	InDev, OutDev uint32
	// Zero when the kernel sent no timestamp.
	Timestamp time.Time
	// Full length of a packet cut by the copy range (0: not cut).
	CapLen uint32
	// Network header onwards, up to the copy range; nil with NfQnlCopyMeta.
	Payload []byte

	state   uint8 // undecided, decided, held
	verdict uint32
	mark    uint32
	setMark bool
	newPkt  []byte
	mangle  bool
}

const (
	undecided = iota
	decided
	heldOver
)

// SetVerdict decides the packet (applied when the batch callback returns).
func (p *Packet) SetVerdict(verdict int) error {
	if !validVerdict(verdict) {
		return ErrInvalidVerdict
	}
	p.state, p.verdict, p.setMark, p.mangle = decided, uint32(verdict), false, false
	return nil
}

// Accept is SetVerdict(NfAccept).
func (p *Packet) Accept() { p.state, p.verdict, p.setMark, p.mangle = decided, NfAccept, false, false }

// Drop is SetVerdict(NfDrop).
func (p *Packet) Drop() { p.state, p.verdict, p.setMark, p.mangle = decided, NfDrop, false, false }

// SetVerdictWithMark decides the packet and sets its mark.
func (p *Packet) SetVerdictWithMark(verdict int, mark uint32) error {
	if err := p.SetVerdict(verdict); err != nil {
		return err
	}
	p.mark, p.setMark = mark, true
	return nil
}

// SetVerdictModPacket decides the packet and replaces its bytes (copied when the batch
// callback returns; see FixChecksums).
func (p *Packet) SetVerdictModPacket(verdict int, packet []byte) error {
	if err := p.SetVerdict(verdict); err != nil {
		return err
	}
	p.newPkt, p.mangle = packet, true
	return nil
}

// Hold keeps the packet undecided past its batch: Nfqueue.SetVerdict decides it later, from
// any goroutine, and its Payload stays valid until then. Held packets occupy frames of the
// ring (Config.MaxQueueLen + 64 of them): a consumer that holds that many gets errors until
// it decides some.
func (p *Packet) Hold() { p.state = heldOver }

// Batch is what one receive handed over: up to 64 packets, in id order.
type Batch struct {
	Packets []Packet
}

// SetVerdict decides every packet of the batch not decided or held yet.
func (b *Batch) SetVerdict(verdict int) error {
	if !validVerdict(verdict) {
		return ErrInvalidVerdict
	}
	for i := range b.Packets {
		if b.Packets[i].state == undecided {
			p := &b.Packets[i]
			p.state, p.verdict, p.setMark, p.mangle = decided, uint32(verdict), false, false
		}
	}
	return nil
}

// Accept is SetVerdict(NfAccept).
func (b *Batch) Accept() { _ = b.SetVerdict(NfAccept) }

// BatchFunc gets each batch on the reader goroutine; packets it leaves undecided and not
// held get Config.DefaultVerdict. Return non-zero to stop reading. The Batch and its Packets
// are reused: they are valid during the call only (a held packet's Payload stays valid until
// its verdict).
type BatchFunc func(b *Batch) int

// RegisterBatch starts reading in batches (instead of RegisterWithErrorFunc). The verdicts
// of a batch go out together when fn returns (a run of equal verdicts as one
// VERDICT_BATCH message), with the next receive.
func (n *Nfqueue) RegisterBatch(ctx context.Context, fn BatchFunc, errfn ErrorFunc) error {
	if fn == nil || errfn == nil {
		return errors.New("nfqueue: nil callback")
	}
	return n.register(reg{ctx: ctx, batch: fn, errfn: errfn})
}

func callBatch(fn BatchFunc, b *Batch) (ret int, perr *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			perr = &PanicError{Value: v, Stack: debug.Stack()}
			if len(b.Packets) > 0 {
				perr.PacketID = b.Packets[0].ID
			}
		}
	}()
	return fn(b), nil
}

func (n *Nfqueue) dispatchBatch(r reg, k int) bool {
	if cap(n.batchBuf) < maxBatch {
		n.batchBuf = make([]Packet, maxBatch)
	}
	pk := n.batchBuf[:k]
	held := unsafe.Slice(n.held, k)
	for i := range held {
		h := &held[i]
		p := &pk[i]
		*p = Packet{
			ID:         uint32(h.id),
			Queue:      uint16(h.queue),
			HwProtocol: uint16(h.hw_protocol),
			Hook:       uint8(h.hook),
			Family:     uint8(h.family),
		}
		pres := uint16(h.present)
		if pres&presMark != 0 {
			p.Mark, p.HasMark = uint32(h.mark), true
		}
		if pres&presIndev != 0 {
			p.InDev = uint32(h.indev)
		}
		if pres&presOutdev != 0 {
			p.OutDev = uint32(h.outdev)
		}
		if pres&presCapLen != 0 {
			p.CapLen = uint32(h.cap_len)
		}
		if pres&presTimestamp != 0 {
			p.Timestamp = time.Unix(int64(h.ts_sec), int64(h.ts_usec)*1000)
		}
		if h.payload != nil {
			p.Payload = n.race.payload(p.ID, unsafe.Slice((*byte)(h.payload), int(h.payload_len)))
		}
	}
	b := Batch{Packets: pk}
	ret, perr := callBatch(r.batch, &b)
	if perr != nil {
		n.count(func(s *Stats) { s.Panics++ })
	}
	for i := range pk {
		p := &pk[i]
		switch p.state {
		case heldOver:
			if perr == nil {
				continue
			}
			n.decide(p.ID, uint32(n.deflt), 0, false)
		case decided:
			if p.mangle {
				n.single(verdictReq{id: p.ID, verdict: p.verdict, mark: p.mark, setMark: p.setMark,
					payload: p.newPkt, mangle: true})
			} else {
				n.decide(p.ID, p.verdict, p.mark, p.setMark)
			}
		default:
			n.decide(p.ID, uint32(n.deflt), 0, false)
		}
		p.Payload, p.newPkt = nil, nil
	}
	n.submit()
	if perr != nil && r.errfn(perr) != 0 {
		return false
	}
	return ret == 0
}
