package p9

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBufferPoolSizes(t *testing.T) {
	var bp bufferPool
	assert.Nil(t, bp.get(pooledMessageMin-1, 1<<20), "small messages are not pooled")

	b := bp.get(pooledMessageMin, 64<<10)
	require.NotNil(t, b)
	assert.Len(t, *b, pooledMessageMin)
	assert.Equal(t, 64<<10, cap(*b), "a new buffer fits any message up to msize")

	big := bp.get(100<<10, 64<<10)
	require.NotNil(t, big)
	assert.Len(t, *big, 100<<10, "a message above the capacity hint still gets all its bytes")
	bp.put(big)
	bp.put(nil) // ignored
}

// Requests of varying sizes, several in flight at once, reuse each other's
// buffers: every byte must still land where its own request said.
func TestRecycledRequestBuffersKeepDataIntact(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "s", false, map[string]string{"f": ""})
	c := r.client(t)
	root, err := c.Attach("s")
	require.NoError(t, err)
	defer root.Close()

	const writers, rounds = 4, 8
	sizes := []int{60 << 10, pooledMessageMin, 1 << 10, 33<<10 + 7, 20 << 10, 100, 48 << 10, pooledMessageMin + 1}
	region := 0
	for _, s := range sizes {
		region += s
	}
	want := make([]byte, writers*region)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		f := clientWalk(t, root, "f")
		_, _, err := f.Open(p9lib.WriteOnly)
		require.NoError(t, err)
		base := w * region
		// Fill want before the goroutines start, so they only read it.
		off := base
		for i, s := range sizes {
			copy(want[off:off+s], bytes.Repeat([]byte{byte('a' + w), byte('0' + i)}, s/2+1))
			off += s
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer f.Close()
			for range rounds {
				off := base
				for _, s := range sizes {
					for done := 0; done < s; {
						n, err := f.WriteAt(want[off+done:off+s], int64(off+done))
						if err != nil {
							errs <- err
							return
						}
						done += n
					}
					off += s
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(waitLimit):
		// A corrupted request is answered with NOTAG: its writer never
		// hears back.
		t.Fatal("writes did not complete: a request was lost or corrupted")
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Len(t, got, len(want))
	assert.True(t, bytes.Equal(want, got), "file written through recycled buffers matches")
}

// failAfter reads from r until n bytes were read, then fails.
type failAfter struct {
	r io.Reader
	n int
}

func (f *failAfter) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("guest memory went away")
	}
	n, err := f.r.Read(p[:min(len(p), f.n)])
	f.n -= n
	return n, err
}

func TestStreamedDataIsReadInPieces(t *testing.T) {
	data := []byte("0123456789")
	p := &pending{data: bytes.NewReader(data), dataLeft: 8} // two bytes beyond the message
	buf := make([]byte, 5)
	n, more := p.readData(buf)
	assert.Equal(t, 5, n)
	assert.True(t, more)
	assert.Equal(t, "01234", string(buf))
	n, more = p.readData(buf)
	assert.Equal(t, 3, n, "never past the message")
	assert.False(t, more)
	assert.Equal(t, "567", string(buf[:n]))
	assert.False(t, p.dataFailed)
}

func TestStreamedDataFailureSendsZerosAndFlagsTheReply(t *testing.T) {
	p := &pending{data: &failAfter{r: bytes.NewReader([]byte("abcdef")), n: 2}, dataLeft: 6}
	buf := []byte("xxxxxx")
	n, more := p.readData(buf)
	assert.Equal(t, 6, n, "the message keeps its length")
	assert.False(t, more)
	assert.Equal(t, []byte{'a', 'b', 0, 0, 0, 0}, buf)
	assert.True(t, p.dataFailed, "the guest must hear EIO, not success")
}

func TestResetDetachesStreamedDataFromGuestMemory(t *testing.T) {
	// A reader that fails once the first 4 bytes are taken: after
	// detachData, readData must not touch it again.
	src := &failAfter{r: bytes.NewReader([]byte("abcdefgh")), n: 8}
	p := &pending{data: src, dataLeft: 8}
	buf := make([]byte, 3)
	_, _ = p.readData(buf)
	p.mu.Lock()
	p.detachData()
	p.mu.Unlock()
	assert.Zero(t, src.n, "the rest was copied out at once")
	src.n = -1 // any further read would now fail
	rest := make([]byte, 10)
	n, more := p.readData(rest)
	assert.Equal(t, "defgh", string(rest[:n]))
	assert.False(t, more)
	assert.False(t, p.dataFailed)
}
