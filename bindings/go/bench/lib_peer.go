//go:build peer

package main

import (
	"context"
	"errors"
	"syscall"

	nflog "github.com/florianl/go-nflog/v2"
	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
)

const lib = "go-nfqueue/go-nflog"

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

// forceBuffer sets SO_RCVBUFFORCE on a netlink connection (the size zcio's sockets get).
func forceBuffer(c *netlink.Conn, n int) {
	rc, err := c.SyscallConn()
	if err != nil {
		fail("syscall conn: %v", err)
	}
	var serr error
	rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n)
	})
	if serr != nil {
		fail("SO_RCVBUFFORCE: %v", serr)
	}
}

func setQueueBuffer(nf *nfqueue.Nfqueue, n int) { forceBuffer(nf.Con, n) }
func setLogBuffer(nf *nflog.Nflog, n int)       { forceBuffer(nf.Con, n) }

func registerBatch(context.Context, *nfqueue.Nfqueue, func(int), int, chan struct{}, nfqueue.ErrorFunc) error {
	return errors.New("go-nfqueue has no batch API")
}

func queueExtra(*nfqueue.Nfqueue, map[string]any) {}
