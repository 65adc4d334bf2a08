// Package testnet makes test hosts for the zcio Go packages' tests, as zcio-testnet and the
// Python tests do: network namespaces (with iptables rules) the tests bind their queues and
// sockets in. It needs root; without it tests skip with the reason, and with
// ZCIO_REQUIRE_PRIV=1 (CI) such a skip fails.
package testnet

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var seq atomic.Uint32

// Require skips t (or fails it under ZCIO_REQUIRE_PRIV=1) when reason is not empty.
func Require(t testing.TB, reason string) {
	t.Helper()
	if reason == "" {
		return
	}
	fmt.Fprintf(os.Stderr, "SKIP %s: %s\n", t.Name(), reason)
	if os.Getenv("ZCIO_REQUIRE_PRIV") == "1" {
		t.Fatalf("%s (ZCIO_REQUIRE_PRIV=1: privileged tests must run)", reason)
	}
	t.Skip(reason)
}

// Problem says why test hosts cannot be made here ("" when they can).
func Problem() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces, iptables, NFQUEUE bind)"
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found: apt-get install -y iproute2 iptables"
		}
	}
	return ""
}

// Host is a network namespace with loopback up.
type Host struct {
	Name string
	fd   int
	t    testing.TB
}

// New makes a host (removed when the test ends), or skips.
func New(t testing.TB, tag string) *Host {
	t.Helper()
	Require(t, Problem())
	name := fmt.Sprintf("zcio-go-%d-%d-%s", os.Getpid(), seq.Add(1), tag)
	if len(name) > 40 {
		name = name[:40]
	}
	h := &Host{Name: name, t: t}
	h.Sh("ip", "netns", "add", name)
	t.Cleanup(func() {
		if h.fd > 0 {
			unix.Close(h.fd)
		}
		_ = exec.Command("ip", "netns", "del", name).Run()
	})
	h.Sh("ip", "-n", name, "link", "set", "lo", "up")
	fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /run/netns/%s: %v", name, err)
	}
	h.fd = fd
	return h
}

// NetNS is a descriptor of the namespace, for Config.NetNS.
func (h *Host) NetNS() int { return h.fd }

// Sh runs a command (on the host's side; prefix "ip netns exec NAME" yourself to run it
// inside) and returns its output; a failure fails the test.
func (h *Host) Sh(args ...string) string {
	h.t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		h.t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// In runs a command inside the namespace.
func (h *Host) In(args ...string) string {
	h.t.Helper()
	return h.Sh(append([]string{"ip", "netns", "exec", h.Name}, args...)...)
}

// Iptables adds a rule (arguments as iptables takes them) inside the namespace.
func (h *Host) Iptables(args ...string) {
	h.t.Helper()
	h.In(append([]string{"iptables"}, args...)...)
}

// Do runs fn on a fresh thread inside the namespace (sockets it makes stay there; they may
// be used from any goroutine afterwards). The thread is discarded afterwards.
func (h *Host) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := unix.Setns(h.fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// UDP listens on addr inside the namespace.
func (h *Host) UDP(addr string) *net.UDPConn {
	h.t.Helper()
	return h.udp("listen", func() (*net.UDPConn, error) {
		a, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return nil, err
		}
		c, err := net.ListenUDP("udp", a)
		if err == nil {
			// Room for a burst while a slow (-race) reader catches up (capped by rmem_max).
			_ = c.SetReadBuffer(4 << 20)
		}
		return c, err
	})
}

// udp makes a socket with mk inside the namespace, closed when the test ends.
func (h *Host) udp(what string, mk func() (*net.UDPConn, error)) *net.UDPConn {
	h.t.Helper()
	var c *net.UDPConn
	err := h.Do(func() (err error) {
		c, err = mk()
		return err
	})
	if err != nil {
		h.t.Fatalf("%s: %v", what, err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// Dial makes a UDP socket inside the namespace connected to addr.
func (h *Host) Dial(addr string) *net.UDPConn {
	h.t.Helper()
	return h.DialFrom("", addr)
}

// DialFrom is Dial from the local address from ("": any).
func (h *Host) DialFrom(from, addr string) *net.UDPConn {
	h.t.Helper()
	return h.udp("dial "+addr, func() (*net.UDPConn, error) {
		a, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return nil, err
		}
		var l *net.UDPAddr
		if from != "" {
			if l, err = net.ResolveUDPAddr("udp", from); err != nil {
				return nil, err
			}
		}
		return net.DialUDP("udp", l, a)
	})
}

// Collect reads datagrams from c until want have arrived or quiet passes without one.
func Collect(c *net.UDPConn, want int, quiet time.Duration) [][]byte {
	var got [][]byte
	buf := make([]byte, 65536)
	for len(got) < want {
		_ = c.SetReadDeadline(time.Now().Add(quiet))
		n, err := c.Read(buf)
		if err != nil {
			break
		}
		got = append(got, append([]byte(nil), buf[:n]...))
	}
	return got
}

// Counter is the packet counter of the first rule of chain whose text contains match.
func (h *Host) Counter(chain, match string) int {
	h.t.Helper()
	out := h.In("iptables", "-nvxL", chain)
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && strings.Contains(l, match) {
			var n int
			fmt.Sscan(f[0], &n)
			return n
		}
	}
	h.t.Fatalf("no rule matching %q in %s:\n%s", match, chain, out)
	return 0
}
