// Command consumer is the consumer side of `zcio bench go`, built twice from the same
// source: with zcio's Go module (default) and, with -tags peer, with go-nfqueue v2.0.3 and
// go-nflog v2.3.0. The callbacks below are the same code in both builds; lib_zcio.go and
// lib_peer.go only name the packages and set the receive buffer.
//
//	consumer nfq QUEUE COUNT      bind, print "ready", read stdin "go", accept COUNT packets,
//	                              print {"cpu", "wall", "handled", ...} (JSON)
//	consumer nfq-batch QUEUE COUNT   the same with zcio's batch API (zcio build only)
//	consumer nflog GROUP          count logged packets by their first payload byte (the bench
//	                              step) until SIGTERM, then print {"counts": {...}} (JSON)
//
// CPU is the whole process's (every thread: the Go runtime's, the reader's), from "ready".
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func cpuNow() float64 {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return float64(r.Utime.Nano()+r.Stime.Nano()) / 1e9
}

func fail(f string, a ...any) {
	fmt.Fprintf(os.Stderr, f+"\n", a...)
	os.Exit(1)
}

// Receive buffer for every consumer: room for the whole pre-filled queue.
const sockLen = 48 << 20

func main() {
	if len(os.Args) < 3 {
		fail("usage: consumer nfq|nfq-batch QUEUE COUNT | nflog GROUP")
	}
	mode := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	switch mode {
	case "nfq", "nfq-batch":
		count, _ := strconv.Atoi(os.Args[3])
		runQueue(mode, uint16(n), count)
	case "nflog":
		runLog(uint16(n))
	default:
		fail("unknown mode %s", mode)
	}
}

func runQueue(mode string, q uint16, count int) {
	nf, err := Open(&Config{NfQueue: q, MaxPacketLen: 0xffff, MaxQueueLen: uint32(count + 4096),
		Copymode: NfQnlCopyPacket})
	if err != nil {
		fail("open: %v", err)
	}
	setQueueBuffer(nf, sockLen)
	gate := make(chan struct{})
	done := make(chan struct{})
	handled := 0
	gated := false
	wait := func() {
		if !gated {
			<-gate
			gated = true
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errfn := func(e error) int {
		fmt.Fprintln(os.Stderr, "error:", e)
		return 0
	}
	if mode == "nfq-batch" {
		err = registerBatch(ctx, nf, func(k int) { wait() }, count, done, errfn)
	} else {
		// The callback (the same code for both libraries).
		fn := func(a Attribute) int {
			wait()
			nf.SetVerdict(*a.PacketID, NfAccept)
			handled++
			if handled == count {
				close(done)
			}
			return 0
		}
		err = nf.RegisterWithErrorFunc(ctx, fn, errfn)
	}
	if err != nil {
		fail("register: %v", err)
	}
	cpu0 := cpuNow()
	fmt.Println("ready")
	in := bufio.NewReader(os.Stdin)
	if l, _ := in.ReadString('\n'); l != "go\n" {
		fail("expected go, got %q", l)
	}
	start := time.Now()
	close(gate)
	<-done
	wall := time.Since(start).Seconds()
	// The last verdicts go out with the reader's next turn: give it that turn.
	time.Sleep(20 * time.Millisecond)
	cpu := cpuNow() - cpu0
	out := map[string]any{"cpu": cpu - 0.0, "wall": wall, "handled": count, "lib": lib}
	queueExtra(nf, out)
	cancel()
	nf.Close()
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

func runLog(group uint16) {
	nf, err := OpenLog(&LogConfig{Group: group, Copymode: LogCopyPacket})
	if err != nil {
		fail("open: %v", err)
	}
	setLogBuffer(nf, 8<<20)
	var counts [256]uint64
	// The callback (the same code for both libraries).
	fn := func(a LogAttribute) int {
		if a.Payload != nil {
			p := *a.Payload
			if len(p) > 28 {
				counts[p[28]]++
			}
		}
		return 0
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithCancel(context.Background())
	if err := nf.RegisterWithErrorFunc(ctx, fn, func(e error) int {
		fmt.Fprintln(os.Stderr, "error:", e)
		return 0
	}); err != nil {
		fail("register: %v", err)
	}
	<-sig
	cancel()
	nf.Close()
	m := map[string]uint64{}
	for i, c := range counts {
		if c > 0 {
			m[strconv.Itoa(i)] = c
		}
	}
	b, _ := json.Marshal(map[string]any{"counts": m, "lib": lib})
	fmt.Println(string(b))
}
