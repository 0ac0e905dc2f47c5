package agent

// endStdin ends a process's input: its stdin is closed once the data
// queued before it is written, and the process reads end of file. Ending
// it again is no error; writing after it is.
func (t *processTable) endStdin(id string) error {
	p, err := t.lookup(id)
	if err != nil {
		return err
	}
	p.endInput()
	return nil
}
