package fsrun

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

func TestModeMountsAndRefusals(t *testing.T) {
	b := &FSBench{Dir: t.TempDir(), Root: "/", NoQemu: true}
	data, root := b.Mounts(guestboot.FSOursVirtioFS)
	require.Equal(t, fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: fsDataTag, Sub: fsDataExport}, data)
	require.Equal(t, fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: fsRootTag, Sub: fsRootExport}, root)
	data, _ = b.Mounts(guestboot.FSQemuVirtiofsd)
	require.Equal(t, fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: fsDataTag}, data)

	_, err := b.Boot(t.Context(), guestboot.FSOursBlk, "guestboot.sdk=x", "END")
	require.ErrorContains(t, err, "block-device system")
	_, err = b.Boot(t.Context(), guestboot.FSQemuVirtiofsd, "guestboot.sdk=x", "END")
	require.True(t, IsUnavailable(err), "%v", err)
	_, err = b.Boot(t.Context(), guestboot.FSOursVirtioFS, "", "END")
	require.ErrorContains(t, err, "command line words")
}
