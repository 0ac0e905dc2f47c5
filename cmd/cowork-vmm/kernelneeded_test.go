package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	hostkvm "github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// TestKernelNeeded: make run builds a kernel only where the kvm backend
// would boot and the one thing missing is the kernel.
func TestKernelNeeded(t *testing.T) {
	cannot := fmt.Errorf("%w: it is PVM", hostkvm.ErrCannotBootLinux)
	none := fmt.Errorf("%w (not embedded in this binary)", kernel.ErrNone)
	unusable := fmt.Errorf("%w: /nowhere: no such file", kernel.ErrOverrideUnusable)
	for _, c := range []struct {
		name, backend      string
		bootsLinux, locate error
		want               bool
	}{
		{"KVM boots Linux, no kernel", "", nil, none, true},
		{"kvm chosen by name, no kernel", "kvm", nil, none, true},
		{"kernel already built", "", nil, nil, false},
		{"KVM cannot boot Linux", "", cannot, none, false},
		{"process backend chosen", "process", nil, none, false},
		{"a named kernel is unusable: run says so", "", nil, unusable, false},
	} {
		got, why := kernelNeeded(c.backend, c.bootsLinux, c.locate)
		assert.Equal(t, c.want, got, "%s: %s", c.name, why)
		assert.NotEmpty(t, why, c.name)
	}
}

// TestKernelNeededMainWithoutKVM: on a host without /dev/kvm the probe
// says no, whatever kernel there is: exit status 1, and the reason.
func TestKernelNeededMainWithoutKVM(t *testing.T) {
	if _, err := os.Stat(hostkvm.DevicePath); !errors.Is(err, os.ErrNotExist) {
		t.Skipf("%s is here (%v): the answer depends on this host's KVM and kernels", hostkvm.DevicePath, err)
	}
	t.Setenv("COWORK_VMM_BACKEND", "")
	var out, errOut bytes.Buffer
	assert.Equal(t, 1, dispatch([]string{"kernel-needed"}, &out, &errOut))
	assert.Contains(t, out.String(), "cannot boot Linux")
	assert.Equal(t, 2, dispatch([]string{"kernel-needed", "extra"}, &out, &errOut))
}
