module github.com/cowork-vmm/cowork-vmm

go 1.26.0

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/hugelgupf/p9 v0.3.0
	github.com/mdlayher/vsock v1.4.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/mdlayher/socket v0.8.0 // indirect
	github.com/u-root/uio v0.0.0-20230305220412-3e8cd9d6bf63 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.24.0 // indirect
)
