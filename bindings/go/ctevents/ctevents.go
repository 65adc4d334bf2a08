// Package ctevents listens to conntrack events (NEW, UPDATE, DESTROY) through zcio's frame
// ring (libzcio), shaped like the event listener of github.com/ti-mo/conntrack as far as it
// maps: Dial, Listen(events channel, workers, groups) returning an error channel, Close, and
// Event{Type, Flow} with the flow's tuples, status, timeout, mark, zone, id, counters and
// timestamps.
//
// One reader goroutine, locked to its own OS thread, owns the libzcio handle and sends each
// event (a value that owns its data) to the channel. Events the kernel dropped at the
// socket are counted exactly (Stats().Lost); Close stops the reader within one wait slice
// (50 ms).
//
// Differences from ti-mo/conntrack: the groups are this package's NetlinkGroup values (not
// github.com/ti-mo/netfilter's); workers is ignored (one reader thread does the work of
// ti-mo's workers); expectations (Event.Expect) are not delivered; Flow has the fields
// below, not ti-mo's helper, labels, security context, sequence adjustments or SYN proxy.
package ctevents

/*
#cgo pkg-config: zcio
#include <stdint.h>
#include <zcio.h>

extern int zcioGoCtEvent(struct zcio_ct_event *e, uintptr_t h);

static int zcio_go_ct_cb(const struct zcio_ct_event *e, void *user) {
	return zcioGoCtEvent((struct zcio_ct_event *)e, (uintptr_t)user);
}

static int zcio_go_ct_process(struct zcio_ctevents *c, int timeout_ms, uintptr_t h) {
	return zcio_ctevents_process(c, timeout_ms, zcio_go_ct_cb, (void *)h);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime/cgo"
	"sync"
	"time"

	"zcio/go/internal/zc"
)

// NetlinkGroup selects event kinds.
type NetlinkGroup uint32

// The conntrack event groups.
const (
	GroupCTNew     NetlinkGroup = C.ZCIO_CT_NEW
	GroupCTUpdate  NetlinkGroup = C.ZCIO_CT_UPDATE
	GroupCTDestroy NetlinkGroup = C.ZCIO_CT_DESTROY
)

// GroupsCT is every conntrack event group.
var GroupsCT = []NetlinkGroup{GroupCTNew, GroupCTUpdate, GroupCTDestroy}

// EventType is ti-mo/conntrack's.
type EventType uint8

// Event types, with ti-mo/conntrack's values.
const (
	EventUnknown EventType = iota
	EventNew
	EventUpdate
	EventDestroy
)

func (t EventType) String() string {
	switch t {
	case EventNew:
		return "new"
	case EventUpdate:
		return "update"
	case EventDestroy:
		return "destroy"
	}
	return "unknown"
}

// Event is one conntrack event.
type Event struct {
	Type EventType
	Flow *Flow
}

// Flow is a conntrack entry.
type Flow struct {
	TupleOrig, TupleReply Tuple
	// IPS_* status bits.
	Status  uint32
	Timeout uint32
	// TCP_CONNTRACK_* (0 when not TCP).
	TCPState uint8
	Mark     uint32
	Zone     uint16
	ID       uint32
	// With nf_conntrack_acct=1 (zero otherwise).
	CountersOrig, CountersReply Counter
	// With nf_conntrack_timestamp=1 (zero otherwise).
	Timestamp Timestamp
	// The port id of the process whose request caused the event (0: traffic or a timeout).
	PortID uint32
}

// Tuple is one direction of a flow.
type Tuple struct {
	IP    IPTuple
	Proto ProtoTuple
}

// IPTuple holds the addresses.
type IPTuple struct {
	SourceAddress, DestinationAddress netip.Addr
}

// ProtoTuple holds the layer-4 protocol and its ports or ICMP fields.
type ProtoTuple struct {
	Protocol                    uint8
	SourcePort, DestinationPort uint16
	ICMPv4, ICMPv6              bool
	ICMPID                      uint16
	ICMPType, ICMPCode          uint8
}

// Counter is one direction's packets and bytes.
type Counter struct{ Packets, Bytes uint64 }

// Timestamp is the entry's start and stop time.
type Timestamp struct{ Start, Stop time.Time }

// Stats are the listener's counters.
type Stats struct {
	Events, New, Update, Destroy uint64
	// Events the kernel dropped at the socket (exact) and overruns seen (ENOBUFS).
	Lost, Overruns uint64
	Syscalls       uint64
}

// Config is the listener's configuration.
type Config struct {
	// An open descriptor of the network namespace to listen in (0: this process's).
	NetNS int
	// Receive buffer bytes (0: 8 MiB).
	RcvBuf uint32
}

// Conn is a conntrack event listener.
type Conn struct {
	cfg Config

	mu        sync.Mutex
	stats     Stats
	listening bool
	closed    bool
	closing   chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	started   bool

	// Reader thread only.
	events chan<- Event
}

// Dial makes a listener (it subscribes in Listen).
func Dial(cfg *Config) (*Conn, error) {
	c := &Conn{closing: make(chan struct{}), done: make(chan struct{})}
	if cfg != nil {
		c.cfg = *cfg
	}
	return c, nil
}

// Listen subscribes to groups and sends every event to evChan (blocking when it is full:
// the kernel then drops at the socket, counted in Stats().Lost). workers is ignored. The
// returned channel gets the reader's errors.
func (c *Conn) Listen(evChan chan<- Event, workers uint8, groups []NetlinkGroup) (chan error, error) {
	var kinds uint32
	for _, g := range groups {
		kinds |= uint32(g)
	}
	if kinds == 0 {
		return nil, errors.New("ctevents: no group to listen to")
	}
	c.mu.Lock()
	if c.listening || c.closed {
		c.mu.Unlock()
		return nil, errors.New("ctevents: listening already, or closed")
	}
	c.listening, c.started = true, true
	c.mu.Unlock()
	c.events = evChan
	errs := make(chan error, 16)
	ready := make(chan error, 1)
	go c.reader(kinds, errs, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return errs, nil
}

func (c *Conn) reader(kinds uint32, errs chan<- error, ready chan<- error) {
	defer close(c.done)
	if err := zc.LockThread(c.cfg.NetNS); err != nil {
		ready <- err
		return
	}
	var h *C.zcio_ctevents
	if rc := C.zcio_ctevents_open(&h, C.uint32_t(kinds), C.uintptr_t(c.cfg.RcvBuf)); rc < 0 {
		ready <- zc.Err("subscribing to conntrack events", int(rc))
		return
	}
	ready <- nil
	ch := cgo.NewHandle(c)
	defer ch.Delete()
	for {
		select {
		case <-c.closing:
			c.refreshStats(h)
			C.zcio_ctevents_free(h)
			return
		default:
		}
		rc := int(C.zcio_go_ct_process(h, 50, C.uintptr_t(ch)))
		if rc < 0 {
			select {
			case errs <- zc.Err("receiving conntrack events", rc):
			default:
			}
		}
		if rc <= 0 {
			c.refreshStats(h)
		}
	}
}

func (c *Conn) refreshStats(h *C.zcio_ctevents) {
	var s C.zcio_ctevents_stats
	if C.zcio_ctevents_get_stats(h, &s) < 0 {
		return
	}
	c.mu.Lock()
	c.stats = Stats{Events: uint64(s.events), New: uint64(s.new_events), Update: uint64(s.update_events),
		Destroy: uint64(s.destroy_events), Lost: uint64(s.lost), Overruns: uint64(s.overruns),
		Syscalls: uint64(s.syscalls)}
	c.mu.Unlock()
}

// Stats returns the counters as of the reader's last idle moment.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Close stops the reader and unsubscribes.
func (c *Conn) Close() error {
	c.mu.Lock()
	started := c.started
	c.closed = true
	c.mu.Unlock()
	c.closeOnce.Do(func() { close(c.closing) })
	if started {
		<-c.done
	}
	return nil
}

func addr(b [16]C.uint8_t, family C.uint8_t) netip.Addr {
	var a [16]byte
	for i := range a {
		a[i] = byte(b[i])
	}
	if family == 2 {
		return netip.AddrFrom4([4]byte(a[:4]))
	}
	return netip.AddrFrom16(a)
}

func tuple(t *C.zcio_ct_tuple, family C.uint8_t) (Tuple, Counter) {
	p := ProtoTuple{Protocol: uint8(t.proto)}
	switch t.proto {
	case 1, 58:
		p.ICMPv4, p.ICMPv6 = t.proto == 1, t.proto == 58
		p.ICMPID, p.ICMPType, p.ICMPCode = uint16(t.icmp_id), uint8(t.icmp_type), uint8(t.icmp_code)
	default:
		if t.has_ports != 0 {
			p.SourcePort, p.DestinationPort = uint16(t.sport), uint16(t.dport)
		}
	}
	return Tuple{IP: IPTuple{addr(t.src, family), addr(t.dst, family)}, Proto: p},
		Counter{uint64(t.packets), uint64(t.bytes)}
}

func nsTime(ns C.uint64_t) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(ns))
}

//export zcioGoCtEvent
func zcioGoCtEvent(e *C.struct_zcio_ct_event, h C.uintptr_t) C.int {
	c := cgo.Handle(h).Value().(*Conn)
	f := &Flow{Status: uint32(e.status), Timeout: uint32(e.timeout), TCPState: uint8(e.tcp_state),
		Mark: uint32(e.mark), Zone: uint16(e.zone), ID: uint32(e.id), PortID: uint32(e.portid),
		Timestamp: Timestamp{nsTime(e.start_ns), nsTime(e.stop_ns)}}
	var co, cr Counter
	f.TupleOrig, co = tuple(&e.orig, e.family)
	f.TupleReply, cr = tuple(&e.reply, e.family)
	if e.has_counters != 0 {
		f.CountersOrig, f.CountersReply = co, cr
	}
	ev := Event{Flow: f}
	switch e.kind {
	case C.ZCIO_CT_NEW:
		ev.Type = EventNew
	case C.ZCIO_CT_UPDATE:
		ev.Type = EventUpdate
	case C.ZCIO_CT_DESTROY:
		ev.Type = EventDestroy
	}
	select {
	case c.events <- ev:
	case <-c.closing:
	}
	return 0
}

// String is a short line for logs.
func (e Event) String() string {
	if e.Flow == nil {
		return e.Type.String()
	}
	o := e.Flow.TupleOrig
	return fmt.Sprintf("%s %d %s:%d -> %s:%d", e.Type, o.Proto.Protocol, o.IP.SourceAddress,
		o.Proto.SourcePort, o.IP.DestinationAddress, o.Proto.DestinationPort)
}
