package vm

import (
	"fmt"
	"strings"
	"testing"
)

func TestConsoleKeepsTheLastLines(t *testing.T) {
	c := newConsole(quiet(), nil)
	for i := range consoleTailLines + 10 {
		fmt.Fprintf(c, "line %d\r\n", i)
	}
	c.Write([]byte("unfinished"))
	lines := strings.Split(c.Tail(), "\n")
	if len(lines) != consoleTailLines+1 {
		t.Fatalf("%d lines kept, want %d + the unfinished one", len(lines), consoleTailLines)
	}
	if lines[0] != "line 10" || lines[consoleTailLines-1] != fmt.Sprintf("line %d", consoleTailLines+9) || lines[consoleTailLines] != "unfinished" {
		t.Errorf("tail starts %q, ends %q / %q", lines[0], lines[consoleTailLines-1], lines[consoleTailLines])
	}
}

func TestConsoleBoundsLinesAndSanitises(t *testing.T) {
	c := newConsole(quiet(), nil)
	long := strings.Repeat("x", 10*consoleLineMax)
	n, err := c.Write([]byte(long + "\n\xff\xfebad\n"))
	if err != nil || n != len(long)+7 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	lines := strings.Split(c.Tail(), "\n")
	if len(lines) != 2 || len(lines[0]) != consoleLineMax || lines[1] != "\uFFFDbad" {
		t.Errorf("lines %d, first %d bytes, second %q", len(lines), len(lines[0]), lines[len(lines)-1])
	}
}

func TestConsoleNotesKernelPanics(t *testing.T) {
	c := newConsole(quiet(), nil)
	c.Write([]byte("[    1.5] Run /init as init process\n"))
	if c.Panicked() {
		t.Fatal("panic noted without one")
	}
	c.Write([]byte("[    1.6] Kernel panic - not syncing: Attempted to kill init!\n"))
	if !c.Panicked() {
		t.Error("kernel panic not noted")
	}
}

func TestConsoleCopiesLines(t *testing.T) {
	var copied strings.Builder
	c := newConsole(quiet(), &copied)
	c.Write([]byte("agent: connected\r\npart"))
	if copied.String() != "agent: connected\n" {
		t.Errorf("copied %q, want the complete line only", copied.String())
	}
}
