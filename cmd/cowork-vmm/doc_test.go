package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDocListsEveryMode: the package comment (doc.go) names every
// subcommand dispatch has, so a reader of `go doc` sees all of them, and
// no subcommand dispatch does not have.
func TestDocListsEveryMode(t *testing.T) {
	fset := token.NewFileSet()
	docFile, err := parser.ParseFile(fset, "doc.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	mainFile, err := parser.ParseFile(fset, "main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	doc := docFile.Doc.Text()
	var modes []string
	for _, d := range mainFile.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "dispatch" {
			modes = caseStrings(fn)
		}
	}
	if len(modes) < 5 {
		t.Fatalf("found %d modes in dispatch (%v): did it move?", len(modes), modes)
	}
	for _, m := range modes {
		if strings.HasPrefix(m, "-") {
			continue // -h, --help: help's spellings
		}
		if !strings.Contains(doc, "cowork-vmm "+m) {
			t.Errorf("doc.go does not list the %q mode", m)
		}
	}
	for _, line := range strings.Split(doc, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "cowork-vmm" || strings.HasPrefix(fields[1], "-") {
			continue
		}
		if !slices.Contains(modes, fields[1]) {
			t.Errorf("doc.go lists %q, which dispatch does not have", fields[1])
		}
	}
}

// caseStrings returns the string constants of fn's case clauses.
func caseStrings(fn *ast.FuncDecl) []string {
	var out []string
	ast.Inspect(fn, func(n ast.Node) bool {
		if cc, ok := n.(*ast.CaseClause); ok {
			for _, e := range cc.List {
				if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						out = append(out, s)
					}
				}
			}
		}
		return true
	})
	return out
}
