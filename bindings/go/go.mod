module zcio/go

go 1.22

require (
	github.com/mdlayher/netlink v1.7.2
	golang.org/x/sys v0.30.0
)

require (
	github.com/google/go-cmp v0.5.9 // indirect
	github.com/josharian/native v1.1.0 // indirect
	github.com/mdlayher/socket v0.4.1 // indirect
	golang.org/x/net v0.9.0 // indirect
	golang.org/x/sync v0.1.0 // indirect
)
