package vmm

import (
	"errors"
	"strings"
	"testing"
)

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
