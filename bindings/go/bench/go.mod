module zcio/go/bench

go 1.24.0

require (
	github.com/florianl/go-nflog/v2 v2.3.0
	github.com/florianl/go-nfqueue/v2 v2.0.3
	github.com/mdlayher/netlink v1.9.1-0.20260312172110-2a932c0fc1ae
	zcio/go v0.0.0
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/mdlayher/socket v0.5.1 // indirect
	golang.org/x/net v0.50.0 // indirect
	golang.org/x/sync v0.19.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
)

replace zcio/go => ../
