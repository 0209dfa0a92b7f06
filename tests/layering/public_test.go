package layering

import (
	"go/importer"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPublicAPIExposesNoInternalType: a program outside this module can import
// pkg/..., but not internal/...; so no exported name under pkg/ may mention an
// internal type, or that part of the public API cannot be used.
func TestPublicAPIExposesNoInternalType(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks pkg/ and its dependencies from source (~15 s); skipped with -short")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := filepath.Glob(filepath.Join(root, "pkg", "*"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "source", nil)
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		pkgPath := module + strings.TrimPrefix(dir, root+"/")
		pkg, err := imp.(types.ImporterFrom).ImportFrom(pkgPath, root, 0)
		if err != nil {
			t.Fatalf("type-check %s: %v", pkgPath, err)
		}
		for _, leak := range internalTypesIn(pkg) {
			t.Errorf("%s: %s", strings.TrimPrefix(pkgPath, module), leak)
		}
	}
}

// internalTypesIn lists the exported objects of pkg whose type names a type from
// an internal package.
func internalTypesIn(pkg *types.Package) []string {
	var leaks []string
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		check := func(what string, typ types.Type) {
			if n := internalIn(typ, map[types.Type]bool{}); n != "" {
				leaks = append(leaks, what+" mentions internal type "+n)
			}
		}
		switch o := obj.(type) {
		case *types.TypeName:
			named, ok := o.Type().(*types.Named)
			if !ok {
				check(name, o.Type())
				continue
			}
			switch u := named.Underlying().(type) {
			case *types.Struct:
				for i := range u.NumFields() {
					if f := u.Field(i); f.Exported() {
						check(name+"."+f.Name(), f.Type())
					}
				}
			case *types.Interface:
				for i := range u.NumMethods() {
					if m := u.Method(i); m.Exported() {
						check(name+"."+m.Name(), m.Type())
					}
				}
			default:
				check(name, u)
			}
			for i := range named.NumMethods() {
				if m := named.Method(i); m.Exported() {
					check(name+"."+m.Name(), m.Type())
				}
			}
		default:
			check(name, obj.Type())
		}
	}
	return leaks
}

// internalIn returns the name of an internal named type that typ is built from,
// looking through pointers, slices, maps, channels and signatures, or "".
func internalIn(typ types.Type, seen map[types.Type]bool) string {
	if seen[typ] {
		return ""
	}
	seen[typ] = true
	switch t := typ.(type) {
	case *types.Named:
		if p := t.Obj().Pkg(); p != nil && strings.Contains(p.Path(), "/internal/") {
			return p.Path() + "." + t.Obj().Name()
		}
		return ""
	case *types.Pointer:
		return internalIn(t.Elem(), seen)
	case *types.Slice:
		return internalIn(t.Elem(), seen)
	case *types.Array:
		return internalIn(t.Elem(), seen)
	case *types.Map:
		if n := internalIn(t.Key(), seen); n != "" {
			return n
		}
		return internalIn(t.Elem(), seen)
	case *types.Chan:
		return internalIn(t.Elem(), seen)
	case *types.Signature:
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for i := range tup.Len() {
				if n := internalIn(tup.At(i).Type(), seen); n != "" {
					return n
				}
			}
		}
	case *types.Struct:
		for i := range t.NumFields() {
			if n := internalIn(t.Field(i).Type(), seen); n != "" {
				return n
			}
		}
	case *types.Interface:
		for i := range t.NumMethods() {
			if n := internalIn(t.Method(i).Type(), seen); n != "" {
				return n
			}
		}
	}
	return ""
}
