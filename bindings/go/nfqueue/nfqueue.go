// Package nfqueue reads NFQUEUE packets through zcio's frame ring (libzcio) with the API of
// github.com/florianl/go-nfqueue/v2: a program written for go-nfqueue changes only its
// import and keeps its callback. It also has a batch API (RegisterBatch): a slice of
// packets per call, batch verdicts.
//
// # How it runs
//
// Open starts one reader goroutine locked to its own OS thread: libzcio's queue belongs to
// the thread that bound it (its io_uring is SINGLE_ISSUER), so every call into libzcio for
// this queue is made there. The callback runs on that goroutine, as go-nfqueue's does.
// Verdicts may be given from any goroutine: they are recorded and sent by the reader — the
// verdicts of one receive batch go out together, a run of equal verdicts as one
// VERDICT_BATCH message, in the same kernel entry as the next receive. A verdict given from
// another goroutine while the reader waits wakes it. Cancelling the context given to
// RegisterWithErrorFunc stops the reader at once (it waits on an eventfd beside the queue),
// and the queue is unbound, as with go-nfqueue.
//
// # Payloads
//
// Attribute.Payload and Packet.Payload point into the frame the kernel's message was
// received in: no copy. They are valid until the packet's verdict; after it the frame is
// reused for other packets. Copy what must outlive the verdict. Built with -race, the
// package hands out a copy instead and overwrites it when the verdict is applied, so the
// race detector reports a read after the verdict from another goroutine, and the bytes read
// after it are garbage on any goroutine.
//
// # Differences from go-nfqueue
//
//   - The queue is bound by Open (go-nfqueue binds in RegisterWithErrorFunc); errors such as
//     a queue bound by another process come from Open.
//   - A callback that panics is recovered: its packet gets Config.DefaultVerdict and the
//     ErrorFunc gets a *PanicError.
//   - SetVerdict* record the verdict and return; a send failure reaches the ErrorFunc.
//   - There is no Con field (no mdlayher/netlink connection); SetOption accepts
//     netlink.NoENOBUFS (zcio never ends a reader on ENOBUFS: overruns are counted in
//     Stats) and refuses other options.
//   - Attribute.Ct, Exp, SecCtx, L2Hdr and SkbPrio are not handed over.
package nfqueue

/*
#cgo pkg-config: zcio
#include <stdlib.h>
#include <zcio.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/mdlayher/netlink"

	"zcio/go/internal/zc"
)

// maxBatch is the most packets one receive hands over.
const maxBatch = 64

// Nfqueue is one bound queue and its reader.
type Nfqueue struct {
	cfg    Config
	logger Logger
	deflt  int

	// The reader's (owner thread's) own state.
	q        *C.zcio_nfqueue
	held     *C.zcio_nfq_held     // [maxBatch]
	dec      *C.zcio_nfq_decision // [maxBatch]
	ndec     int
	rfd      int
	unsent   uint32 // highest id decided since the last send (valid when hasUnsent)
	hasUns   bool
	batchBuf []Packet
	race     raceState

	waker *zc.Waker

	mu       sync.Mutex
	pending  []verdictReq
	spare    []verdictReq
	closed   bool // the queue was freed (unbound)
	reading  bool
	stats    Stats
	path     string
	sleeping atomic.Bool
	stop     atomic.Bool

	regs      chan reg
	closing   chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type verdictReq struct {
	id      uint32
	verdict uint32
	mark    uint32
	setMark bool
	through bool // SetVerdictBatch: every held id up to id
	payload []byte
	mangle  bool
}

type reg struct {
	ctx   context.Context
	hook  HookFunc
	batch BatchFunc
	errfn ErrorFunc
}

// Stats are the queue's counters (a snapshot the reader refreshes after every batch).
type Stats struct {
	Received, Accepted, Dropped, Repeated, Requeued uint64
	// VERDICT_BATCH messages, the packets they covered, single VERDICT messages.
	Batches, Batched, Singles uint64
	// Packets held (received, no verdict yet).
	Held uint64
	// Receive buffer overruns (ENOBUFS): the kernel dropped packets for this queue.
	Overruns uint64
	// Kernel entries: verdict sends, receives and waits.
	SendSyscalls, RecvSyscalls uint64
	// Callbacks that panicked (their packets got DefaultVerdict).
	Panics uint64
	// Verdicts for packets not held here (decided already, or never received).
	UnknownVerdicts uint64
}

// PanicError is what the ErrorFunc gets when the callback panicked.
type PanicError struct {
	PacketID uint32
	Value    any
	Stack    []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("nfqueue callback panicked on packet %d: %v", e.PacketID, e.Value)
}

// Open binds the queue and starts its reader thread (reading begins with Register*).
func Open(config *Config) (*Nfqueue, error) {
	if config.Flags >= nfQaCfgFlagMax {
		return nil, ErrInvFlag
	}
	if !validVerdict(config.DefaultVerdict) {
		return nil, ErrInvalidVerdict
	}
	n := &Nfqueue{
		cfg:     *config,
		deflt:   config.DefaultVerdict,
		regs:    make(chan reg),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	n.logger = config.Logger
	if n.logger == nil {
		n.logger = devNull{}
	}
	errc := make(chan error, 1)
	go n.owner(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	return n, nil
}

type devNull struct{}

func (devNull) Debugf(string, ...interface{}) {}
func (devNull) Errorf(string, ...interface{}) {}

// owner is the reader goroutine: it opens, reads and frees the queue on its own thread.
func (n *Nfqueue) owner(errc chan<- error) {
	defer close(n.done)
	if err := zc.LockThread(n.cfg.NetNS); err != nil {
		errc <- err
		return
	}
	var c C.zcio_nfqueue_config
	c.first = C.uint16_t(n.cfg.NfQueue)
	c.last = c.first
	if n.cfg.Copymode == NfQnlCopyPacket {
		c.copy_mode = C.ZCIO_NFQ_COPY_PACKET
		c.copy_range = C.uint32_t(n.cfg.MaxPacketLen)
	} else {
		c.copy_mode = C.ZCIO_NFQ_COPY_META
	}
	c.max_len = C.uint32_t(n.cfg.MaxQueueLen)
	if c.max_len == 0 {
		c.max_len = kernelDefaultMaxQueueLen
	}
	c.flags = C.uint32_t(n.cfg.Flags)
	c.rcvbuf = C.uint32_t(n.cfg.ReadBuffer)
	var q *C.zcio_nfqueue
	if rc := C.zcio_nfqueue_open_config(&q, &c); rc < 0 {
		errc <- zc.Err(fmt.Sprintf("binding queue %d", n.cfg.NfQueue), int(rc))
		return
	}
	rfd := C.zcio_nfqueue_readiness_fd(q)
	if rfd < 0 {
		err := zc.Err("readiness descriptor", int(rfd))
		C.zcio_nfqueue_free(q)
		errc <- err
		return
	}
	w, err := zc.NewWaker()
	if err != nil {
		C.zcio_nfqueue_free(q)
		errc <- err
		return
	}
	n.q, n.rfd, n.waker = q, int(rfd), w
	n.held = (*C.zcio_nfq_held)(C.calloc(maxBatch, C.sizeof_zcio_nfq_held))
	n.dec = (*C.zcio_nfq_decision)(C.calloc(maxBatch, C.sizeof_zcio_nfq_decision))
	n.race.init()
	n.path = C.GoString(C.zcio_nfqueue_path(q))
	errc <- nil
	select {
	case r := <-n.regs:
		n.read(r)
	case <-n.closing:
	}
	n.shutdown()
}

// shutdown sends the verdicts given, unbinds (the kernel drops what is still queued, as
// when go-nfqueue's reader unbinds) and frees.
func (n *Nfqueue) shutdown() {
	n.applyPending()
	n.refreshStats()
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	C.zcio_nfqueue_free(n.q)
	n.q = nil
	C.free(unsafe.Pointer(n.held))
	C.free(unsafe.Pointer(n.dec))
	n.mu.Lock()
	n.waker.Close()
	n.waker = nil
	n.mu.Unlock()
}

// Close stops the reader (if any), sends the verdicts already given and unbinds.
func (n *Nfqueue) Close() error {
	n.closeOnce.Do(func() {
		n.stop.Store(true)
		close(n.closing)
		n.wakeUp()
	})
	<-n.done
	return nil
}

// wakeUp interrupts the reader's wait (any goroutine).
func (n *Nfqueue) wakeUp() {
	n.mu.Lock()
	if n.waker != nil {
		n.waker.Wake()
	}
	n.mu.Unlock()
}

// Register attaches fn; errors that are not timeouts stop the reader.
//
// Deprecated: as in go-nfqueue, use RegisterWithErrorFunc.
func (n *Nfqueue) Register(ctx context.Context, fn HookFunc) error {
	return n.RegisterWithErrorFunc(ctx, fn, func(err error) int {
		var p *PanicError
		if errors.As(err, &p) {
			n.logger.Errorf("%v", err)
			return 0
		}
		n.logger.Errorf("Could not receive message: %v", err)
		return 1
	})
}

// RegisterWithErrorFunc starts reading: fn gets every packet on the reader goroutine, errfn
// every error. Reading stops when ctx is done (within milliseconds), when fn or errfn return
// non-zero, or at Close; then the queue is unbound.
func (n *Nfqueue) RegisterWithErrorFunc(ctx context.Context, fn HookFunc, errfn ErrorFunc) error {
	if fn == nil || errfn == nil {
		return errors.New("nfqueue: nil callback")
	}
	return n.register(reg{ctx: ctx, hook: fn, errfn: errfn})
}

func (n *Nfqueue) register(r reg) error {
	n.mu.Lock()
	if n.closed || n.reading {
		n.mu.Unlock()
		if n.reading {
			return errors.New("nfqueue: a callback is registered already")
		}
		return zc.ErrClosed
	}
	n.reading = true
	n.mu.Unlock()
	select {
	case n.regs <- r:
		return nil
	case <-n.done:
		return zc.ErrClosed
	}
}

// SetOption accepts netlink.NoENOBUFS (zcio counts overruns and never ends a reader on
// them) and refuses other options.
func (n *Nfqueue) SetOption(o netlink.ConnOption, enable bool) error {
	if o == netlink.NoENOBUFS {
		return nil
	}
	return &zc.Error{Op: fmt.Sprintf("netlink option %d", o), Errno: syscall.ENOPROTOOPT,
		Reason: "zcio's queue socket takes no such option"}
}

// Stats returns the counters as of the reader's last batch.
func (n *Nfqueue) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Path says how packets are received: "frame-ring+io_uring" or "frame-ring+recvmmsg".
func (n *Nfqueue) Path() string { return n.path }

func validVerdict(v int) bool {
	switch v & 0xffff {
	case NfDrop, NfAccept, NfStolen, NfQeueue, NfRepeat:
		return v>>16 == 0 || v&0xffff == NfQeueue
	}
	return false
}

func (n *Nfqueue) push(r verdictReq) error {
	if !validVerdict(int(r.verdict)) {
		return ErrInvalidVerdict
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return zc.ErrClosed
	}
	n.pending = append(n.pending, r)
	if n.sleeping.Load() && n.waker != nil {
		n.waker.Wake()
	}
	n.mu.Unlock()
	return nil
}

// SetVerdict gives packet id its verdict (from any goroutine).
func (n *Nfqueue) SetVerdict(id uint32, verdict int) error {
	return n.push(verdictReq{id: id, verdict: uint32(verdict)})
}

// SetVerdictBatch gives every packet held here with an id up to id (in the kernel's wrapping
// order) the verdict.
func (n *Nfqueue) SetVerdictBatch(id uint32, verdict int) error {
	return n.push(verdictReq{id: id, verdict: uint32(verdict), through: true})
}

// SetVerdictWithMark gives packet id its verdict and a new mark.
func (n *Nfqueue) SetVerdictWithMark(id uint32, verdict, mark int) error {
	return n.push(verdictReq{id: id, verdict: uint32(verdict), mark: uint32(mark), setMark: true})
}

// SetVerdictModPacket gives packet id its verdict and replaces its bytes with packet (copied;
// FixChecksums makes a rewritten packet's sums valid, which the kernel checks).
func (n *Nfqueue) SetVerdictModPacket(id uint32, verdict int, packet []byte) error {
	return n.push(verdictReq{id: id, verdict: uint32(verdict), mangle: true,
		payload: append([]byte(nil), packet...)})
}

// SetVerdictModPacketWithMark is SetVerdictModPacket with a new mark.
func (n *Nfqueue) SetVerdictModPacketWithMark(id uint32, verdict, mark int, packet []byte) error {
	return n.push(verdictReq{id: id, verdict: uint32(verdict), mangle: true, mark: uint32(mark),
		setMark: true, payload: append([]byte(nil), packet...)})
}

// FixChecksums makes a rewritten IPv4/IPv6 packet valid: the IP and UDP length fields, the
// IPv4 header sum and the TCP/UDP/UDP-Lite/ICMP/ICMPv6 sum. It refuses (packet untouched)
// fragments, ESP and packets cut by the copy range.
func FixChecksums(packet []byte) error {
	if len(packet) == 0 {
		return &zc.Error{Op: "fixing checksums", Errno: syscall.EINVAL, Reason: "empty packet"}
	}
	return fixChecksums(packet)
}

// read is the reader loop (owner thread).
func (n *Nfqueue) read(r reg) {
	stopWatch := context.AfterFunc(r.ctx, n.wakeUp)
	defer stopWatch()
	for {
		if n.stop.Load() || r.ctx.Err() != nil {
			return
		}
		n.applyPending()
		k := int(C.zcio_nfqueue_receive(n.q, 0, n.held, maxBatch))
		n.hasUns = false
		if k < 0 {
			err := zc.Err("receiving", k)
			if errors.Is(err, syscall.ENOTCONN) {
				r.errfn(err)
				return
			}
			if r.errfn(err) != 0 {
				return
			}
			n.wait(r.ctx, 10)
			continue
		}
		if k == 0 {
			n.refreshStats()
			n.wait(r.ctx, -1)
			continue
		}
		var goOn bool
		if r.hook != nil {
			goOn = n.dispatchHooks(r, k)
		} else {
			goOn = n.dispatchBatch(r, k)
		}
		n.refreshStats()
		if !goOn {
			return
		}
	}
}

// wait sleeps until packets, a verdict from another goroutine, cancellation or Close.
func (n *Nfqueue) wait(ctx context.Context, ms int) {
	n.sleeping.Store(true)
	n.mu.Lock()
	busy := len(n.pending) > 0
	n.mu.Unlock()
	if !busy && !n.stop.Load() && ctx.Err() == nil {
		woken, err := n.waker.Wait(n.rfd, ms)
		if err != nil {
			n.logger.Errorf("%v", err)
		}
		if woken {
			n.waker.Clear()
		}
	}
	n.sleeping.Store(false)
}

func (n *Nfqueue) refreshStats() {
	var s C.zcio_nfq_stats
	if C.zcio_nfqueue_get_stats(n.q, &s) < 0 {
		return
	}
	n.mu.Lock()
	n.stats.Received = uint64(s.received)
	n.stats.Accepted = uint64(s.accepted)
	n.stats.Dropped = uint64(s.dropped)
	n.stats.Repeated = uint64(s.repeated)
	n.stats.Requeued = uint64(s.requeued)
	n.stats.Batches = uint64(s.batches)
	n.stats.Batched = uint64(s.batched)
	n.stats.Singles = uint64(s.singles)
	n.stats.Held = uint64(s.held)
	n.stats.Overruns = uint64(s.overruns)
	n.stats.SendSyscalls = uint64(s.send_syscalls)
	n.stats.RecvSyscalls = uint64(s.recv_syscalls)
	n.mu.Unlock()
}

func (n *Nfqueue) count(f func(s *Stats)) {
	n.mu.Lock()
	f(&n.stats)
	n.mu.Unlock()
}

// decide queues one plain verdict into the C decision array (owner thread). A verdict for
// an id below one decided and unsent goes out after those are sent: the kernel sees verdicts
// in the order they were given (go-nfqueue users reorder packets by deciding out of order).
func (n *Nfqueue) decide(id, verdict, mark uint32, setMark bool) {
	if n.hasUns && int32(id-n.unsent) < 0 {
		n.submit()
		n.flush()
	}
	if !n.hasUns || int32(id-n.unsent) > 0 {
		n.unsent, n.hasUns = id, true
	}
	d := (*C.zcio_nfq_decision)(unsafe.Add(unsafe.Pointer(n.dec), uintptr(n.ndec)*C.sizeof_zcio_nfq_decision))
	*d = C.zcio_nfq_decision{}
	d.queue = C.uint16_t(n.cfg.NfQueue)
	d.id = C.uint32_t(id)
	d.verdict = C.uint32_t(verdict)
	if setMark {
		d.set_mark = 1
		d.mark = C.uint32_t(mark)
	}
	n.ndec++
	n.race.decided(id)
	if n.ndec == maxBatch {
		n.submit()
	}
}

// submit hands the decision array to libzcio (no system call: the verdicts go out with the
// next receive or flush).
func (n *Nfqueue) submit() {
	if n.ndec == 0 {
		return
	}
	k := n.ndec
	n.ndec = 0
	taken := int(C.zcio_nfqueue_decide(n.q, n.dec, C.size_t(k)))
	if taken == k {
		return
	}
	if taken < 0 {
		n.logger.Errorf("%v", zc.Err("deciding", taken))
		return
	}
	ds := unsafe.Slice(n.dec, k)
	for i := range ds {
		if ds[i].result != 0 {
			n.count(func(s *Stats) { s.UnknownVerdicts++ })
			n.logger.Debugf("verdict for packet %d not taken: %v", uint32(ds[i].id),
				syscall.Errno(-ds[i].result))
		}
	}
}

func (n *Nfqueue) flush() {
	if rc := C.zcio_nfqueue_flush(n.q); rc < 0 {
		n.logger.Errorf("%v", zc.Err("sending verdicts", int(rc)))
	}
	n.hasUns = false
}

// single decides one packet with a replacement payload (owner thread).
func (n *Nfqueue) single(r verdictReq) {
	n.submit()
	var p unsafe.Pointer
	if len(r.payload) > 0 {
		p = unsafe.Pointer(&r.payload[0])
	}
	setMark := C.int(0)
	if r.setMark {
		setMark = 1
	}
	rc := C.zcio_nfqueue_verdict(n.q, C.uint16_t(n.cfg.NfQueue), C.uint32_t(r.id),
		C.uint32_t(r.verdict), setMark, C.uint32_t(r.mark), p, C.size_t(len(r.payload)))
	if rc < 0 {
		err := zc.Err(fmt.Sprintf("verdict for packet %d", r.id), int(rc))
		if errors.Is(err, syscall.ENOENT) {
			n.count(func(s *Stats) { s.UnknownVerdicts++ })
		}
		n.logger.Errorf("%v", err)
		return
	}
	n.race.decided(r.id)
	n.hasUns = true
	if int32(r.id-n.unsent) > 0 {
		n.unsent = r.id
	}
}

// applyPending hands the verdicts given since the last batch to libzcio (owner thread).
func (n *Nfqueue) applyPending() {
	n.mu.Lock()
	reqs := n.pending
	n.pending = n.spare[:0]
	n.mu.Unlock()
	for i := range reqs {
		r := &reqs[i]
		switch {
		case r.through:
			n.submit()
			rc := C.zcio_nfqueue_decide_through(n.q, C.uint16_t(n.cfg.NfQueue), C.uint32_t(r.id), C.uint32_t(r.verdict))
			if rc < 0 {
				n.logger.Errorf("%v", zc.Err("batch verdict", int(rc)))
			}
			n.race.decidedThrough(r.id)
		case r.mangle:
			n.single(*r)
		default:
			n.decide(r.id, r.verdict, r.mark, r.setMark)
		}
		*r = verdictReq{}
	}
	n.submit()
	n.mu.Lock()
	n.spare = reqs[:0]
	n.mu.Unlock()
}

// dispatchHooks hands k received packets to the go-nfqueue callback, one at a time.
func (n *Nfqueue) dispatchHooks(r reg, k int) bool {
	held := unsafe.Slice(n.held, k)
	for i := range held {
		h := &held[i]
		a := n.attribute(h)
		ret, p := callHook(r.hook, a, uint32(h.id))
		if p != nil {
			n.count(func(s *Stats) { s.Panics++ })
			_ = n.push(verdictReq{id: uint32(h.id), verdict: uint32(n.deflt)})
			if r.errfn(p) != 0 {
				return false
			}
			continue
		}
		if ret != 0 {
			return false
		}
	}
	return true
}

func callHook(fn HookFunc, a Attribute, id uint32) (ret int, perr *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			perr = &PanicError{PacketID: id, Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(a), nil
}

// attrStore holds the values an Attribute points to (one allocation per packet).
type attrStore struct {
	id                       uint32
	hook                     uint8
	hwProto                  uint16
	mark, indev, outdev      uint32
	physin, physout, caplen  uint32
	uid, gid, ctinfo         uint32
	ts                       time.Time
	payload, hwaddr, skbinfo []byte
	hwbuf                    [8]byte
	skbbuf                   [4]byte
}

const (
	presMark = 1 << iota
	presIndev
	presOutdev
	presPhysIndev
	presPhysOutdev
	presTimestamp
	presCapLen
	presSkbInfo
	presUID
	presGID
	presCtInfo
	presHwAddr
)

func (n *Nfqueue) attribute(h *C.zcio_nfq_held) Attribute {
	s := new(attrStore)
	s.id, s.hook, s.hwProto = uint32(h.id), uint8(h.hook), uint16(h.hw_protocol)
	a := Attribute{PacketID: &s.id, Hook: &s.hook, HwProtocol: &s.hwProto}
	p := uint16(h.present)
	opt := func(bit uint16, v C.uint32_t, dst *uint32, field **uint32) {
		if p&bit != 0 {
			*dst = uint32(v)
			*field = dst
		}
	}
	opt(presMark, h.mark, &s.mark, &a.Mark)
	opt(presIndev, h.indev, &s.indev, &a.InDev)
	opt(presOutdev, h.outdev, &s.outdev, &a.OutDev)
	opt(presPhysIndev, h.physindev, &s.physin, &a.PhysInDev)
	opt(presPhysOutdev, h.physoutdev, &s.physout, &a.PhysOutDev)
	opt(presCapLen, h.cap_len, &s.caplen, &a.CapLen)
	opt(presUID, h.uid, &s.uid, &a.UID)
	opt(presGID, h.gid, &s.gid, &a.GID)
	opt(presCtInfo, h.ct_info, &s.ctinfo, &a.CtInfo)
	if p&presTimestamp != 0 {
		s.ts = time.Unix(int64(h.ts_sec), int64(h.ts_usec)*1000)
		a.Timestamp = &s.ts
	}
	if p&presSkbInfo != 0 {
		v := uint32(h.skb_info)
		s.skbbuf = [4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
		s.skbinfo = s.skbbuf[:]
		a.SkbInfo = &s.skbinfo
	}
	if p&presHwAddr != 0 {
		l := int(h.hwaddr_len)
		for i := 0; i < l && i < 8; i++ {
			s.hwbuf[i] = byte(h.hwaddr[i])
		}
		s.hwaddr = s.hwbuf[:l]
		a.HwAddr = &s.hwaddr
	}
	if h.payload != nil {
		s.payload = n.race.payload(uint32(h.id), unsafe.Slice((*byte)(h.payload), int(h.payload_len)))
		a.Payload = &s.payload
	}
	return a
}
