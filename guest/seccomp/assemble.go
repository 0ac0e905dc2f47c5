package seccomp

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// assembler builds a classic BPF program whose conditional jumps name
// labels, resolved to the forward skips BPF wants.
type assembler struct {
	ops []asmOp
}

// asmOp is an instruction, a jump to labels, or (name only) a label.
type asmOp struct {
	ins             bpf.Instruction
	cond            bpf.JumpTest
	val             uint32
	ifTrue, ifFalse string // "": the next instruction
	isJump          bool
	label           string
}

func (a *assembler) ins(i bpf.Instruction) { a.ops = append(a.ops, asmOp{ins: i}) }

func (a *assembler) label(name string) { a.ops = append(a.ops, asmOp{label: name}) }

func (a *assembler) jump(cond bpf.JumpTest, val uint32, ifTrue, ifFalse string) {
	a.ops = append(a.ops, asmOp{isJump: true, cond: cond, val: val, ifTrue: ifTrue, ifFalse: ifFalse})
}

// assemble resolves the labels and assembles the program.
func (a *assembler) assemble() ([]bpf.RawInstruction, error) {
	at := map[string]int{}
	n := 0
	for _, op := range a.ops {
		if op.label != "" {
			if _, dup := at[op.label]; dup {
				return nil, fmt.Errorf("seccomp: label %q defined twice", op.label)
			}
			at[op.label] = n
			continue
		}
		n++
	}
	if n > maxInstructions {
		return nil, fmt.Errorf("seccomp: the program has %d instructions, more than the kernel's %d", n, maxInstructions)
	}
	prog := make([]bpf.Instruction, 0, n)
	for _, op := range a.ops {
		switch {
		case op.label != "":
		case !op.isJump:
			prog = append(prog, op.ins)
		default:
			here := len(prog)
			skipTrue, err := skipTo(at, op.ifTrue, here)
			if err != nil {
				return nil, err
			}
			skipFalse, err := skipTo(at, op.ifFalse, here)
			if err != nil {
				return nil, err
			}
			prog = append(prog, bpf.JumpIf{Cond: op.cond, Val: op.val, SkipTrue: skipTrue, SkipFalse: skipFalse})
		}
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assembling the filter: %w", err)
	}
	return raw, nil
}

// skipTo is the skip from the jump at here to label ("" is the next
// instruction): forward only, at most 255.
func skipTo(at map[string]int, label string, here int) (uint8, error) {
	if label == "" {
		return 0, nil
	}
	target, ok := at[label]
	if !ok {
		return 0, fmt.Errorf("seccomp: no label %q", label)
	}
	skip := target - here - 1
	if skip < 0 || skip > 255 {
		return 0, fmt.Errorf("seccomp: the jump to %q spans %d instructions (0 to 255 forward are possible)", label, skip)
	}
	return uint8(skip), nil
}
