# cowork-vmm — see README.md.
GO        ?= go
BIN       := bin/cowork-vmm
PKG       := ./cmd/cowork-vmm
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# Where built kernels are cached, outside the clone, keyed by config hash.
KERNEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cowork-vmm/kernels

PREFIX    ?= /usr/local
DESTDIR   ?=

.PHONY: all check-go build run test bench fuzz kernel nested clean install uninstall install-client-helper

all: build

# The guest kernel for this host's arch: `make kernel` builds it and `make
# build` embeds it (gzip-compressed) in $(BIN).
EMBED_DIR          := guest/kernel/embedded
GUEST_VMLINUX      := $(KERNEL_CACHE)/guest-current/vmlinux
GUEST_IMAGE_ARM64  := $(KERNEL_CACHE)/guest-arm64-current/Image
ifeq ($(shell uname -m),aarch64)
HOST_GUEST_FLAVOUR := guest-arm64
HOST_GUEST_KERNEL  := $(GUEST_IMAGE_ARM64)
HOST_EMBED_KERNEL  := $(EMBED_DIR)/Image-arm64.gz
HOST_KERNEL_MAKE   := make kernel-arm64
else
HOST_GUEST_FLAVOUR := guest
HOST_GUEST_KERNEL  := $(GUEST_VMLINUX)
HOST_EMBED_KERNEL  := $(EMBED_DIR)/vmlinux.gz
HOST_KERNEL_MAKE   := make kernel
endif

# $(call build-helper,GOARCH (empty: the host's),guest kernel,its embedded copy,output,how to build the kernel)
# A static binary; when the guest kernel for its arch is built, it is
# embedded (gzip-compressed) so the helper needs nothing else on the host.
define build-helper
	@tags=; \
	if [ -f '$(2)' ]; then \
		if [ ! -f $(3) ] || [ '$(2)' -nt $(3) ]; then \
			echo "embedding the guest kernel $(2)"; \
			gzip -9 -n -c '$(2)' > $(3).tmp && mv $(3).tmp $(3) || exit 1; \
		fi; \
		tags='-tags embedkernel'; \
	else \
		rm -f $(3); \
		echo "no guest kernel built ($(5)): $(4) will look for one at run time"; \
	fi; \
	CGO_ENABLED=0 $(if $(1),GOARCH=$(1)) $(GO) build $$tags -trimpath -ldflags '$(LDFLAGS)' -o $(4) $(PKG)
endef

build: check-go
	$(call build-helper,,$(HOST_GUEST_KERNEL),$(HOST_EMBED_KERNEL),$(BIN),$(HOST_KERNEL_MAKE))

# The helper for arm64 hosts, built on any host, with the arm64 guest
# kernel embedded when `make kernel-arm64` has built it.
.PHONY: build-arm64
build-arm64: check-go
	$(call build-helper,arm64,$(GUEST_IMAGE_ARM64),$(EMBED_DIR)/Image-arm64.gz,$(BIN)-arm64,make kernel-arm64)

# A clear message instead of "go: not found" on a fresh machine.
check-go:
	@command -v $(GO) >/dev/null 2>&1 || { echo "make: Go 1.26 or later is needed on PATH (https://go.dev/dl/; Debian 12's golang package is too old)"; exit 1; }

# The newcomer's main job: build, then run one command in a fresh guest. On
# a host whose KVM boots Linux with no guest kernel built yet (a fresh
# clone), it builds the kernel first (`cowork-vmm kernel-needed` decides;
# guest/kernel/build.sh says which apt packages to install if some are
# missing) and embeds it, so the command runs in a VM instead of falling
# back to the process backend. Elsewhere it runs at once, as before.
run: build
	@if ./$(BIN) kernel-needed; then \
		$(MAKE) --no-print-directory kernel && $(MAKE) --no-print-directory build || exit 1; \
	fi
	./$(BIN) run -- sh -c 'echo hello from the cowork-vmm guest; uname -a'

# gofmt, go.mod and go.sum as go mod tidy leaves them (this runs offline
# once the modules go.sum names are in the module cache, as .ci/run puts
# them), go vet, then every test.
test:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	@$(GO) mod tidy -diff || { echo "make: go.mod/go.sum differ from what go mod tidy makes (above): run go mod tidy (or, if a module could not be read, download them as .ci/run does)"; exit 1; }
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 45m ./...

BENCH_RUNS ?= 5
BENCH_OUT  ?= build/bench
# Runs per system of the file-sharing and block-device benchmarks in `make
# bench` (0: none).
BENCH_FS_RUNS ?= 3
# Boots per system of the real Claude Code CLI's turns in `make bench` (0:
# none; skipped with the reason when scripts/fetch-sdk.sh has not run).
BENCH_SDK_RUNS ?= 3
# Their sizes: full, ci, or mib=N,rand=N,tree=DIRSxFILES.
BENCH_FS_SIZES ?= full

# Go micro-benchmarks, then the boot benchmark: directly on a host whose KVM
# boots Linux, otherwise inside the nested harness (needs qemu-system-x86).
bench: build kernel kernel-outer
	$(GO) test -run '^$$' -bench . -benchmem ./bench/ ./protocol/ ./devices/vsock/ ./devices/p9/ ./devices/virtio/ ./guest/agent/ ./vmm/ ./helper/backend/vm/
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/cowork-bench ./bench/cmd/cowork-bench
	KERNEL_CACHE='$(KERNEL_CACHE)' ./bin/cowork-bench --binary $(BIN) --runs $(BENCH_RUNS) --fs-runs $(BENCH_FS_RUNS) --fs-sizes '$(BENCH_FS_SIZES)' --sdk-runs $(BENCH_SDK_RUNS) --out $(BENCH_OUT)
	@echo "bench: results in $(BENCH_OUT)/report.md, report.json, report.svg"

# The file-sharing benchmark alone, full sizes (64 MiB, 2000 random reads,
# 10 000 files, 3 runs of each system): our virtio-fs and virtio-9p, qemu's
# virtio-9p and virtiofsd, in the nested harness where this host's KVM
# cannot boot Linux (TestNestedFSBench), else directly (TestFSBench).
# `make test` runs the small variant.
.PHONY: fs-bench
fs-bench: kernel kernel-outer
	COWORK_VMM_FS_BENCH=full $(GO) test -count=1 -v -timeout 3h -run '^(TestNestedFSBench|TestFSBench)$$' ./testharness/nested/ ./testharness/guestboot/fsrun/

# The block-device benchmark alone, full sizes (64 MiB written + fsync'd and
# read on a raw disk, 2000 random reads, 3 runs of each): our virtio-blk and
# qemu's on the same image file, the same way as fs-bench.
.PHONY: blk-bench
blk-bench: kernel kernel-outer
	COWORK_VMM_FS_BENCH=full GUESTBOOT_FS_SYSTEMS=ours-blk,qemu-blk $(GO) test -count=1 -v -timeout 1h -run '^(TestNestedFSBench|TestFSBench)$$' ./testharness/nested/ ./testharness/guestboot/fsrun/

# Every fuzz target for FUZZTIME (default 5s) beyond its seed corpus.
fuzz:
	FUZZTIME='$(FUZZTIME)' GO='$(GO)' scripts/fuzz.sh

clean:
	rm -rf bin build $(EMBED_DIR)/vmlinux.gz $(EMBED_DIR)/Image-arm64.gz

# install does not depend on build, so `sudo make install` never runs the Go
# build as root.
install:
	@test -x $(BIN) || { echo "run 'make build' first"; exit 1; }
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/cowork-vmm

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/cowork-vmm

# Put bin/cowork-vmm where Claude Desktop looks for its helper (keeps a backup;
# `scripts/install-client-helper.sh restore` puts the official one back).
install-client-helper:
	scripts/install-client-helper.sh install $(BIN)

# Guest kernel (and the nested harness's outer kernel), built from Debian's
# linux-source-6.1 into $(KERNEL_CACHE), rebuilt only when the config
# changes. `make kernel` builds the guest for this host's arch; the -arm64
# targets cross-build the arm64 kernels on any host (gcc-aarch64-linux-gnu).
kernel:
	KERNEL_CACHE='$(KERNEL_CACHE)' guest/kernel/build.sh $(HOST_GUEST_FLAVOUR)

.PHONY: kernel-arm64 kernel-outer-arm64 kernel-outer-16k-arm64
kernel-arm64:
	KERNEL_CACHE='$(KERNEL_CACHE)' guest/kernel/build.sh guest-arm64

kernel-outer-arm64:
	KERNEL_CACHE='$(KERNEL_CACHE)' guest/kernel/build.sh outer-arm64

# The arm64 outer kernel with 16 KiB pages, for the harness's 16 KiB-page
# tests (Options.Pages16K).
kernel-outer-16k-arm64:
	KERNEL_CACHE='$(KERNEL_CACHE)' guest/kernel/build.sh outer-16k-arm64

# The 2-vCPU stress: STRESS_BOOTS boots (default 50) of a 2-vCPU guest
# through the helper, each with a spawn; in the nested harness with 2 outer
# CPUs where this host's KVM cannot boot Linux, else directly. Not in CI.
STRESS_BOOTS ?= 50
.PHONY: nested-stress
nested-stress: kernel kernel-outer
	COWORK_VMM_STRESS_BOOTS=$(STRESS_BOOTS) $(GO) test -count=1 -v -timeout 6h -run '^(TestNestedKVMStress|TestKVMStress2VCPUs)$$' ./e2e/

# The stand-in VM bundle tests boot in place of the client's (issue #41):
# a GPT disk with an ext4 Debian userland, built into $(BUNDLE_CACHE) (root
# or sudo -n needed), rebuilt only when scripts/make-bundle.sh, its package
# list or the Debian release changes. BUNDLE_OUT=dir also copies it there.
BUNDLE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cowork-vmm/bundles
.PHONY: bundle
bundle:
	BUNDLE_CACHE='$(BUNDLE_CACHE)' scripts/make-bundle.sh $(BUNDLE_OUT)

.PHONY: kernel-outer
kernel-outer:
	KERNEL_CACHE='$(KERNEL_CACHE)' guest/kernel/build.sh outer

# Run CMD inside the nested harness (qemu TCG + nested SVM: a real /dev/kvm),
# with PAYLOAD shared read-write at /payload; exits with CMD's status.
#   make nested PAYLOAD=dir CMD='sh -c "ls -l /dev/kvm"'
nested: kernel-outer
	CGO_ENABLED=0 $(GO) build -o bin/nested ./testharness/nested/cmd/nested
	KERNEL_CACHE='$(KERNEL_CACHE)' ./bin/nested $(if $(PAYLOAD),--payload '$(PAYLOAD)') -- $(CMD)
