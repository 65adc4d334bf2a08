package nfqueue

import (
	"errors"
	"time"
)

// Attribute contains the elements of one queued packet, as go-nfqueue's: a field the
// kernel did not send is nil. Payload points into zcio's frame ring (no copy): it is valid
// until the packet's verdict, and must not be used after it (see the package comment).
//
// zcio does not hand over Ct, Exp, SecCtx, L2Hdr and SkbPrio (always nil).
type Attribute struct {
	PacketID   *uint32
	Hook       *uint8
	Timestamp  *time.Time
	Mark       *uint32
	InDev      *uint32
	PhysInDev  *uint32
	OutDev     *uint32
	PhysOutDev *uint32
	Payload    *[]byte
	CapLen     *uint32
	UID        *uint32
	GID        *uint32
	SecCtx     *string
	L2Hdr      *[]byte
	HwAddr     *[]byte
	HwProtocol *uint16
	Ct         *[]byte
	CtInfo     *uint32
	SkbInfo    *[]byte
	Exp        *[]byte
	SkbPrio    *uint32
}

// HookFunc receives the queued packets, one call each, on the queue's reader goroutine.
// To stop receiving, return something other than 0.
type HookFunc func(a Attribute) int

// ErrorFunc receives the errors of the reader (and a recovered panic of the callback as a
// *PanicError). To stop receiving, return something other than 0.
type ErrorFunc func(e error) int

// Logger provides logging functionality.
type Logger interface {
	Debugf(format string, args ...interface{})
	Errorf(format string, args ...interface{})
}

// Config contains options for a queue: go-nfqueue's fields, plus DefaultVerdict.
type Config struct {
	// Network namespace the queue is bound in: an open descriptor of it (e.g. of
	// /run/netns/NAME). 0: the namespace of a new thread of this process.
	NetNS int

	// Queue number.
	NfQueue uint16
	// Maximum number of packets the kernel queues for this consumer (0: 1024).
	MaxQueueLen uint32

	// Bytes of each packet copied (with NfQnlCopyPacket; 0: all, up to 65535).
	MaxPacketLen uint32

	// NfQnlCopyNone, NfQnlCopyMeta or NfQnlCopyPacket.
	Copymode uint8

	// NfQaCfgFlag* (NfQaCfgFlagSecCx is refused: zcio does not hand over security contexts).
	Flags uint32

	// Accepted for go-nfqueue programs; zcio binds for every family.
	AfFamily uint8

	// Deprecated in go-nfqueue; ignored.
	ReadTimeout time.Duration

	// Ignored: verdicts are sent by the reader, batched, without blocking the caller.
	WriteTimeout time.Duration

	// Interface to log internals.
	Logger Logger

	// DefaultVerdict (zcio): the verdict of a packet whose callback panicked, and of a
	// packet a batch callback left undecided and not held. The zero value is NfDrop: what
	// nobody judged is not let through.
	DefaultVerdict int

	// ReadBuffer (zcio): the queue socket's receive buffer in bytes (0: 4 MiB), set with
	// SO_RCVBUFFORCE where the process may (else SO_RCVBUF, capped by net.core.rmem_max).
	ReadBuffer int
}

// Errors, as go-nfqueue's.
var (
	ErrRecvMsg        = errors.New("received error message")
	ErrUnexpMsg       = errors.New("received unexpected message from kernel")
	ErrInvFlag        = errors.New("invalid Flag")
	ErrNotLinux       = errors.New("not implemented for OS other than linux")
	ErrInvalidVerdict = errors.New("invalid verdict")
)

// Configuration flags.
const (
	NfQaCfgFlagFailOpen  = (1 << iota)
	NfQaCfgFlagConntrack = (1 << iota)
	NfQaCfgFlagGSO       = (1 << iota)
	NfQaCfgFlagUIDGid    = (1 << iota)
	NfQaCfgFlagSecCx     = (1 << iota)
	nfQaCfgFlagMax       = (1 << iota)
)

// Copy modes.
const (
	NfQnlCopyNone = iota
	NfQnlCopyMeta
	NfQnlCopyPacket
)

// Verdicts. NfQeueue keeps go-nfqueue's spelling; its target queue goes in bits 16..31.
const (
	NfDrop = iota
	NfAccept
	NfStolen
	NfQeueue
	NfRepeat
)

const kernelDefaultMaxQueueLen = 1024
