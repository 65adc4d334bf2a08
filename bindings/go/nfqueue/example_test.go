package nfqueue_test

import (
	"context"
	"log"

	"zcio/go/nfqueue"
)

// The README's example: drop UDP to port 53 (IPv4 without options), accept the rest, in
// batches. Needs a rule such as iptables -A INPUT -p udp -j NFQUEUE --queue-num 1.
func ExampleNfqueue_RegisterBatch() {
	ctx := context.Background()
	nf, err := nfqueue.Open(&nfqueue.Config{NfQueue: 1, Copymode: nfqueue.NfQnlCopyPacket})
	if err != nil {
		log.Fatal(err)
	}
	defer nf.Close()
	nf.RegisterBatch(ctx, func(b *nfqueue.Batch) int {
		for i := range b.Packets {
			if p := b.Packets[i].Payload; p[9] == 17 && p[22] == 0 && p[23] == 53 {
				b.Packets[i].Drop()
			}
		}
		b.Accept()
		return 0
	}, func(err error) int { log.Print(err); return 0 })
}
