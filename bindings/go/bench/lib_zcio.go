//go:build !peer

package main

import (
	"context"

	"zcio/go/nflog"
	"zcio/go/nfqueue"
)

const lib = "zcio"

type (
	Attribute    = nfqueue.Attribute
	Config       = nfqueue.Config
	LogAttribute = nflog.Attribute
	LogConfig    = nflog.Config
)

const (
	NfAccept        = nfqueue.NfAccept
	NfQnlCopyPacket = nfqueue.NfQnlCopyPacket
	LogCopyPacket   = nflog.CopyPacket
)

var (
	Open    = nfqueue.Open
	OpenLog = nflog.Open
)

// zcio's queue sizes its buffer at Open (Config.ReadBuffer): see openQueue.
func setQueueBuffer(*nfqueue.Nfqueue, int) {}

// zcio's NFLOG socket has an 8 MiB buffer (SO_RCVBUFFORCE) by default.
func setLogBuffer(*nflog.Nflog, int) {}

func init() {
	open := Open
	Open = func(c *Config) (*nfqueue.Nfqueue, error) {
		c.ReadBuffer = sockLen
		return open(c)
	}
}

func registerBatch(ctx context.Context, nf *nfqueue.Nfqueue, gate func(int), count int, done chan struct{}, errfn nfqueue.ErrorFunc) error {
	handled := 0
	return nf.RegisterBatch(ctx, func(b *nfqueue.Batch) int {
		gate(len(b.Packets))
		b.Accept()
		if handled < count && handled+len(b.Packets) >= count {
			defer close(done)
		}
		handled += len(b.Packets)
		return 0
	}, errfn)
}

func queueExtra(nf *nfqueue.Nfqueue, out map[string]any) {
	s := nf.Stats()
	out["path"] = nf.Path()
	out["syscalls"] = s.SendSyscalls + s.RecvSyscalls
}
