package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The root package holds two layers (docs/architecture.md): the core — the record
// state machine, the guard, its handles, leases, steps, the completer and the cleaner,
// which gRPC, the consumers, Do and the HTTP middleware all use — and the HTTP
// middleware, the adapter handler authors mount. Each of the package's files belongs to
// one of them; the lists below are the map's, and a new file must be put on one.
var (
	coreFiles = []string{
		"canonical.go", "cleaner.go", "completer.go", "cutoff.go", "defaults.go", "do.go",
		"doc.go", "errors.go", "guard.go", "handle.go", "idem_aliases.go", "key.go",
		"lease.go", "localkeys.go", "observer.go", "quota.go", "replaycache.go", "retryrate.go",
		"sealing.go", "sealstate.go", "step.go", "storectx.go", "storestate.go", "transition.go", "versions.go", "formats.go",
	}
	httpFiles = []string{
		"capture.go", "claim_in_handler.go", "config.go", "fingerprint.go", "middleware.go",
		"policy.go", "problem.go", "respond.go",
	}
)

// The core does not reach into an adapter: no core file imports net/http or any of
// idem's adapter packages, nor uses a name (a function, type, variable, constant or
// method) that only an HTTP file declares. It fails the day a core file calls up into
// the middleware.
func TestTheCoreUsesNoAdapter(t *testing.T) {
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	names, _ := filepath.Glob("*.go")
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
		if !slices.Contains(coreFiles, name) && !slices.Contains(httpFiles, name) {
			t.Errorf("%s is on neither layer's list: put it on one (and in docs/architecture.md)", name)
		}
	}
	for _, name := range append(slices.Clone(coreFiles), httpFiles...) {
		if files[name] == nil {
			t.Errorf("%s is listed but does not exist", name)
		}
	}
	declared := func(list []string) (top, methods map[string]bool) {
		top, methods = map[string]bool{}, map[string]bool{}
		for _, name := range list {
			f := files[name]
			if f == nil {
				continue
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Recv != nil {
						methods[d.Name.Name] = true
					} else {
						top[d.Name.Name] = true
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							top[s.Name.Name] = true
							if it, ok := s.Type.(*ast.InterfaceType); ok {
								for _, m := range it.Methods.List {
									for _, n := range m.Names {
										methods[n.Name] = true // a method the layer calls through its own interface
									}
								}
							}
						case *ast.ValueSpec:
							for _, n := range s.Names {
								top[n.Name] = true
							}
						}
					}
				}
			}
		}
		return top, methods
	}
	coreTop, coreMethods := declared(coreFiles)
	for name := range contractMembers(t, fset) {
		coreMethods[name] = true // a field or method of the contracts' types, such as Response.Header
	}
	httpTop, httpMethods := declared(httpFiles)
	var found []string
	for _, name := range coreFiles {
		f := files[name]
		if f == nil {
			continue
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if p == "net/http" || strings.HasPrefix(p, "net/http/") || adapterPackage(p) {
				found = append(found, fset.Position(im.Pos()).String()+": imports "+p)
			}
		}
		var visit func(n ast.Node) bool
		visit = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if httpMethods[n.Sel.Name] && !coreMethods[n.Sel.Name] && !coreTop[n.Sel.Name] && !stdMethods[n.Sel.Name] {
					found = append(found, fset.Position(n.Sel.Pos()).String()+": uses ."+n.Sel.Name+", declared in an HTTP file")
				}
				ast.Inspect(n.X, visit)
				return false
			case *ast.KeyValueExpr: // a struct literal's field name is not a use
				ast.Inspect(n.Value, visit)
				return false
			case *ast.Field: // nor is a field's or parameter's name
				ast.Inspect(n.Type, visit)
				return false
			case *ast.Ident:
				if httpTop[n.Name] && !coreTop[n.Name] {
					found = append(found, fset.Position(n.Pos()).String()+": uses "+n.Name+", declared in an HTTP file")
				}
			}
			return true
		}
		ast.Inspect(f, visit)
	}
	sort.Strings(found)
	for _, f := range found {
		t.Error(f)
	}
}

// adapterPackage reports whether p is one of idem's adapters (or a store, or a tool):
// the core may import only the contracts idemstore, observe and seal, and internal helpers
// that import no adapter themselves.
func adapterPackage(p string) bool {
	const mod = "github.com/idem-go/idem/"
	if !strings.HasPrefix(p, mod) {
		return false
	}
	switch rest := strings.TrimPrefix(p, mod); rest {
	case "idemstore", "observe", "seal", "internal/logsummary", "internal/corehooks":
		return false
	}
	return true
}

// contractMembers returns the names of the fields and methods that the contracts
// (idemstore, observe, seal) declare: the core uses them on the contracts' types.
func contractMembers(t *testing.T, fset *token.FileSet) map[string]bool {
	names := map[string]bool{}
	for _, dir := range []string{"idemstore", "observe", "seal"} {
		paths, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, path := range paths {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.FuncDecl:
					if n.Recv != nil {
						names[n.Name.Name] = true
					}
				case *ast.Field:
					for _, id := range n.Names {
						names[id.Name] = true
					}
				}
				return true
			})
		}
	}
	if len(names) == 0 {
		t.Fatal("no field or method found in the contracts: the test reads nothing")
	}
	return names
}

// stdMethods are methods of the standard library's types that the core calls and
// that an HTTP file happens to declare too (slog.Logger.Handler, Middleware.Handler):
// the test matches names, not types.
var stdMethods = map[string]bool{"Handler": true}
