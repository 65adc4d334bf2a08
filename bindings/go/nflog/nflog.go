// Package nflog reads NFLOG groups through zcio's frame ring (libzcio) with the API of
// github.com/florianl/go-nflog/v2 as far as it maps: Open(&Config{Group, Copymode,
// Bufsize}), RegisterWithErrorFunc(ctx, fn, errfn), Close, the Attribute struct.
//
// One reader goroutine, locked to its own OS thread, owns the libzcio handle (it belongs to
// the thread that opened it) and calls fn for every logged packet, in arrival order.
// Cancelling ctx stops it within one wait slice (50 ms). Losses are counted, never silent:
// Stats reports the messages missing in the group's sequence numbers (exact), overruns and
// the socket's drops.
//
// Differences from go-nflog:
//   - Attribute.Payload (and HwHeader) point into the frame ring: valid during fn only. Copy
//     what must outlive the call. (Built with -race, they are copies overwritten after fn.)
//   - Sequence numbers are always on (FlagSeq); FlagGlobal and FlagConntrack are refused.
//     QThresh and Timeout are zcio's (256 messages, 10 ms): they size the frames the kernel's
//     batches land in.
//   - The group is bound by Open; no Con field; SetOption accepts netlink.NoENOBUFS only.
package nflog

/*
#cgo pkg-config: zcio
#include <stdint.h>
#include <zcio.h>

extern int zcioGoNflogPacket(struct zcio_nflog_packet *p, uintptr_t h);

static int zcio_go_nflog_cb(const struct zcio_nflog_packet *p, void *user) {
	return zcioGoNflogPacket((struct zcio_nflog_packet *)p, (uintptr_t)user);
}

static int zcio_go_nflog_process(struct zcio_nflog *l, int timeout_ms, uintptr_t h) {
	return zcio_nflog_process(l, timeout_ms, zcio_go_nflog_cb, (void *)h);
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/cgo"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/mdlayher/netlink"

	"zcio/go/internal/zc"
)

// Copy modes and flags, as go-nflog's.
const (
	CopyNone   byte = 0x00
	CopyMeta   byte = 0x01
	CopyPacket byte = 0x02

	FlagSeq       uint16 = 0x0001
	FlagGlobal    uint16 = 0x0002
	FlagConntrack uint16 = 0x0004
)

// GenericGroup is go-nflog's.
const GenericGroup uint16 = 0x1

// Errors, as go-nflog's.
var (
	ErrCopyMode    = errors.New("unsupported copy mode")
	ErrUnknownFlag = errors.New("unsupported flag")
)

// Config is go-nflog's (see the package comment for what zcio takes).
type Config struct {
	// An open descriptor of the network namespace to bind in (0: this process's).
	NetNS    int
	Flags    uint16
	QThresh  uint32
	Timeout  uint32
	Group    uint16
	Copymode uint8
	// Bytes copied per packet with CopyPacket (0: 65531, the most a message carries).
	Bufsize     uint32
	Settings    uint16
	ReadTimeout time.Duration
	Logger      Logger
}

// Logger provides logging functionality.
type Logger interface {
	Debugf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Attribute is one logged packet, as go-nflog's; a field the kernel did not send is nil.
// Ct, CtInfo, HwType, HwAddr, HwLen, Layer2Hdr, VLAN, SeqGlobal, PhysInDev and PhysOutDev
// are not handed over by libzcio (always nil).
type Attribute struct {
	Hook       *uint8
	Mark       *uint32
	Timestamp  *time.Time
	InDev      *uint32
	PhysInDev  *uint32
	OutDev     *uint32
	PhysOutDev *uint32
	Payload    *[]byte
	Prefix     *string
	UID        *uint32
	Seq        *uint32
	SeqGlobal  *uint32
	GID        *uint32
	HwType     *uint16
	HwAddr     *[]byte
	HwHeader   *[]byte
	HwLen      *uint16
	HwProtocol *uint16
	CtInfo     *uint32
	Ct         *[]byte
	Layer2Hdr  *[]byte
	VLAN       *VLAN
}

// VLAN is go-nflog's.
type VLAN struct {
	Proto uint16
	TCI   uint16
}

// HookFunc gets every logged packet; return non-zero to stop.
type HookFunc func(a Attribute) int

// ErrorFunc gets the reader's errors; return non-zero to stop.
type ErrorFunc func(e error) int

// Stats are the consumer's counters.
type Stats struct {
	Packets uint64
	// Messages missing in the group's sequence numbers (exact; a loss at the end of a burst
	// shows once a later message arrives).
	Lost, SeqGaps uint64
	// Receive buffer overruns (ENOBUFS) and batches the kernel dropped at the socket.
	Overruns, KernelDrops uint64
	Datagrams, Syscalls   uint64
}

// slice is the longest wait between looks at ctx and Close.
const slice = 50

// Nflog is one bound group and its reader.
type Nflog struct {
	cfg    Config
	logger Logger
	l      *C.zcio_nflog

	mu      sync.Mutex
	stats   Stats
	reading bool
	closed  bool

	regs      chan reg
	closing   chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	// The callback's state during one process call (reader thread only).
	cur    *reg
	stop   bool
	prefix string
	race   raceState
}

type reg struct {
	ctx   context.Context
	fn    HookFunc
	errfn ErrorFunc
}

type devNull struct{}

func (devNull) Debugf(string, ...any) {}
func (devNull) Errorf(string, ...any) {}

// Open binds the group and starts the reader thread (reading begins with Register*).
func Open(config *Config) (*Nflog, error) {
	if config == nil {
		config = &Config{}
	}
	// go-nflog's own checks first, with its errors.
	if config.Flags > FlagConntrack {
		return nil, ErrUnknownFlag
	}
	if config.Copymode != CopyNone && config.Copymode != CopyMeta && config.Copymode != CopyPacket {
		return nil, ErrCopyMode
	}
	if config.Flags&^FlagSeq != 0 {
		return nil, &zc.Error{Op: "nflog flags", Errno: syscall.EOPNOTSUPP, Reason: fmt.Sprintf(
			"flags %#x: zcio numbers every group's messages (FlagSeq) and offers no other flag", config.Flags)}
	}
	var copyRange uint32
	switch config.Copymode {
	case CopyNone, CopyMeta:
	case CopyPacket:
		copyRange = config.Bufsize
		if copyRange == 0 || copyRange > 65531 {
			copyRange = 65531
		}
	}
	n := &Nflog{cfg: *config, regs: make(chan reg), closing: make(chan struct{}), done: make(chan struct{})}
	n.logger = config.Logger
	if n.logger == nil {
		n.logger = devNull{}
	}
	errc := make(chan error, 1)
	go n.owner(copyRange, errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Nflog) owner(copyRange uint32, errc chan<- error) {
	defer close(n.done)
	if err := zc.LockThread(n.cfg.NetNS); err != nil {
		errc <- err
		return
	}
	group := C.uint16_t(n.cfg.Group)
	var l *C.zcio_nflog
	if rc := C.zcio_nflog_open(&l, &group, 1, C.uint32_t(copyRange)); rc < 0 {
		errc <- zc.Err(fmt.Sprintf("binding NFLOG group %d", n.cfg.Group), int(rc))
		return
	}
	n.l = l
	n.race.init()
	errc <- nil
	select {
	case r := <-n.regs:
		n.read(r)
	case <-n.closing:
	}
	n.refreshStats()
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	C.zcio_nflog_free(n.l)
	n.l = nil
}

// Close stops the reader and unbinds the group.
func (n *Nflog) Close() error {
	n.closeOnce.Do(func() { close(n.closing) })
	<-n.done
	return nil
}

// SetOption accepts netlink.NoENOBUFS (zcio counts overruns and never ends a reader on them).
func (n *Nflog) SetOption(o netlink.ConnOption, enable bool) error {
	if o == netlink.NoENOBUFS {
		return nil
	}
	return &zc.Error{Op: fmt.Sprintf("netlink option %d", o), Errno: syscall.ENOPROTOOPT,
		Reason: "zcio's NFLOG socket takes no such option"}
}

// Register is RegisterWithErrorFunc with an ErrorFunc that stops on any error.
//
// Deprecated: as in go-nflog.
func (n *Nflog) Register(ctx context.Context, fn HookFunc) error {
	return n.RegisterWithErrorFunc(ctx, fn, func(err error) int {
		n.logger.Errorf("Could not receive message: %v", err)
		return 1
	})
}

// RegisterWithErrorFunc starts reading: fn gets every packet on the reader goroutine.
func (n *Nflog) RegisterWithErrorFunc(ctx context.Context, fn HookFunc, errfn ErrorFunc) error {
	if fn == nil || errfn == nil {
		return errors.New("nflog: nil callback")
	}
	n.mu.Lock()
	if n.closed || n.reading {
		n.mu.Unlock()
		return zc.ErrClosed
	}
	n.reading = true
	n.mu.Unlock()
	select {
	case n.regs <- reg{ctx: ctx, fn: fn, errfn: errfn}:
		return nil
	case <-n.done:
		return zc.ErrClosed
	}
}

// Stats returns the counters as of the reader's last wait.
func (n *Nflog) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

func (n *Nflog) refreshStats() {
	var s C.zcio_nflog_stats
	if C.zcio_nflog_get_stats(n.l, &s) < 0 {
		return
	}
	n.mu.Lock()
	n.stats = Stats{Packets: uint64(s.packets), Lost: uint64(s.lost), SeqGaps: uint64(s.seq_gaps),
		Overruns: uint64(s.overruns), KernelDrops: uint64(s.kernel_drops),
		Datagrams: uint64(s.datagrams), Syscalls: uint64(s.syscalls)}
	n.mu.Unlock()
}

func (n *Nflog) read(r reg) {
	h := cgo.NewHandle(n)
	defer h.Delete()
	n.cur = &r
	for {
		select {
		case <-n.closing:
			return
		default:
		}
		if r.ctx.Err() != nil {
			return
		}
		rc := int(C.zcio_go_nflog_process(n.l, slice, C.uintptr_t(h)))
		if n.stop {
			return
		}
		if rc < 0 {
			if r.errfn(zc.Err("receiving", rc)) != 0 {
				return
			}
		}
		if rc == 0 {
			n.refreshStats()
		}
	}
}

//export zcioGoNflogPacket
func zcioGoNflogPacket(p *C.struct_zcio_nflog_packet, h C.uintptr_t) C.int {
	n := cgo.Handle(h).Value().(*Nflog)
	if n.stop {
		return 0
	}
	a := n.attribute(p)
	if n.cur.fn(a) != 0 {
		n.stop = true
	}
	n.race.done()
	return 0
}

type attrStore struct {
	hook                uint8
	hwProto             uint16
	mark, indev, outdev uint32
	uid, gid, seq       uint32
	ts                  time.Time
	payload             []byte
	prefix              string
}

func (n *Nflog) attribute(p *C.struct_zcio_nflog_packet) Attribute {
	s := new(attrStore)
	s.hook, s.hwProto = uint8(p.hook), uint16(p.hw_protocol)
	a := Attribute{Hook: &s.hook, HwProtocol: &s.hwProto}
	if p.has_mark != 0 {
		s.mark = uint32(p.mark)
		a.Mark = &s.mark
	}
	if p.indev != 0 {
		s.indev = uint32(p.indev)
		a.InDev = &s.indev
	}
	if p.outdev != 0 {
		s.outdev = uint32(p.outdev)
		a.OutDev = &s.outdev
	}
	if p.has_uid != 0 {
		s.uid, s.gid = uint32(p.uid), uint32(p.gid)
		a.UID, a.GID = &s.uid, &s.gid
	}
	if p.has_seq != 0 {
		s.seq = uint32(p.seq)
		a.Seq = &s.seq
	}
	if p.has_timestamp != 0 {
		s.ts = time.Unix(int64(p.ts_sec), int64(p.ts_usec)*1000)
		a.Timestamp = &s.ts
	}
	if p.prefix != nil {
		b := unsafe.Slice((*byte)(unsafe.Pointer(p.prefix)), int(p.prefix_len))
		// Prefixes repeat: reuse the last string when the bytes are the same (no allocation).
		if string(b) != n.prefix {
			n.prefix = string(b)
		}
		s.prefix = n.prefix
		a.Prefix = &s.prefix
	}
	if p.payload != nil {
		s.payload = n.race.payload(unsafe.Slice((*byte)(p.payload), int(p.payload_len)))
		a.Payload = &s.payload
	}
	return a
}
