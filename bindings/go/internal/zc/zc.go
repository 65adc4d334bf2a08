// Package zc is the cgo glue the zcio Go packages share: errors that carry the errno and
// libzcio's reason, the owner thread (libzcio's netlink handles belong to the thread that
// opened them), and the wake-up descriptor that interrupts an owner's wait.
package zc

/*
#cgo pkg-config: zcio
#include <zcio.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// Error is a failed libzcio call: the operation, the errno (what errors.Is matches) and
// libzcio's reason (zcio_last_error), when it gave one.
type Error struct {
	Op     string
	Errno  syscall.Errno
	Reason string
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("zcio: %s: %s (%v)", e.Op, e.Reason, e.Errno)
	}
	return fmt.Sprintf("zcio: %s: %v", e.Op, e.Errno)
}

// Unwrap returns the errno, so errors.Is(err, syscall.EPERM) works.
func (e *Error) Unwrap() error { return e.Errno }

// Err turns a negative libzcio result into an *Error. It must run on the thread that made
// the call (the reason is per thread): the owner goroutines are locked to their threads.
func Err(op string, rc int) error {
	if rc >= 0 {
		return nil
	}
	e := &Error{Op: op, Errno: syscall.Errno(-rc)}
	if r := C.zcio_last_error(); r != nil {
		e.Reason = C.GoString(r)
	}
	return e
}

// ErrClosed is returned by calls on a handle after Close (or after its reader ended and
// unbound it).
var ErrClosed = errors.New("zcio: handle closed")

// LockThread locks the calling goroutine to its OS thread for good (the thread ends with the
// goroutine, so a namespace entered on it never leaks into others) and enters the network
// namespace netns (an open descriptor of it) when it is not 0.
func LockThread(netns int) error {
	runtime.LockOSThread()
	if netns != 0 {
		if err := unix.Setns(netns, unix.CLONE_NEWNET); err != nil {
			return &Error{Op: "entering the network namespace", Errno: err.(syscall.Errno)}
		}
	}
	return nil
}

// Waker interrupts an owner's wait from any goroutine (an eventfd).
type Waker struct{ fd int }

// NewWaker makes the eventfd.
func NewWaker() (*Waker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, &Error{Op: "eventfd", Errno: err.(syscall.Errno)}
	}
	return &Waker{fd: fd}, nil
}

// Wake makes the descriptor readable.
func (w *Waker) Wake() {
	var one = [8]byte{1}
	_, _ = unix.Write(w.fd, one[:])
}

// Clear reads the descriptor back to not readable.
func (w *Waker) Clear() {
	var b [8]byte
	_, _ = unix.Read(w.fd, b[:])
}

// Close closes the descriptor.
func (w *Waker) Close() { _ = unix.Close(w.fd) }

// Wait blocks until fd or the waker is readable or timeoutMs passes (-1: no limit).
// Returns whether the waker fired.
func (w *Waker) Wait(fd int, timeoutMs int) (woken bool, err error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(w.fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, timeoutMs)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, &Error{Op: "poll", Errno: err.(syscall.Errno)}
		}
		return fds[1].Revents != 0, nil
	}
}
