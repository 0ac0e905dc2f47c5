package vmm

import (
	"errors"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

func TestInternalErrorIsPrintedLikeQemu(t *testing.T) {
	r := kvm.Regs{RIP: 0xffffffff81000123, RAX: 0x1234, RFLAGS: 0x46}
	s := kvm.Sregs{CR0: 0x80050033, EFER: 0xd01}
	s.CS.Selector = 0x10
	out := formatInternalError(kvm.InternalError{
		Suberror:    kvm.InternalErrorEmulation,
		Data:        []uint64{1, 0x30f, 0xc70f48},
		Instruction: []byte{0x48, 0x0f, 0xc7},
	}, formatRegisters(r, s, []byte{0x90, 0xcc, 0xf4}, 1))
	for _, want := range []string{
		"KVM internal error. Suberror: 1\n",
		"extra data[0]: 0x0000000000000001\n",
		"extra data[2]: 0x0000000000c70f48\n",
		"emulation failure\n",
		"Instruction bytes: 48 0f c7\n",
		"RAX=0000000000001234 ",
		"RIP=ffffffff81000123 RFL=00000046\n",
		"CS =0010 ",
		"EFER=0000000000000d01",
		"Code=90 <cc> f4\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

func TestExitCleanAndErrors(t *testing.T) {
	for _, k := range []ExitKind{ExitStopped, ExitReset, ExitPowerOff} {
		e := Exit{Kind: k, VCPU: -1}
		if !e.Clean() || e.AsError() != nil {
			t.Errorf("%s should be clean", k)
		}
	}
	cause := errors.New("boom")
	e := Exit{Kind: ExitError, VCPU: 1, Err: cause}
	if e.Clean() || !errors.Is(e.AsError(), cause) || !strings.Contains(e.String(), "on vCPU 1") {
		t.Errorf("error exit: %v / %v", e, e.AsError())
	}
	if e := (Exit{Kind: ExitTripleFault, VCPU: 0}); e.AsError() == nil || !strings.Contains(e.AsError().Error(), "triple fault") {
		t.Errorf("triple fault: %v", e.AsError())
	}
}
