package translate

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// Validation of what is built: the generated Validate() of each message,
// and the deep check that opens every Any (validation that does not
// depend on what else the proxy gets; cross-references are check.go's).

// Validate runs a resource's generated validation, and that of every
// message packed in its Any fields.
func Validate(m proto.Message) error {
	if v, ok := m.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return err // unwrapped: the generated message names the field
		}
	}
	return walkAny(m.ProtoReflect())
}

func walkAny(m protoreflect.Message) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = visit(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = visit(mv.Message())
				return err == nil
			})
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			err = visit(v.Message())
		}
		return err == nil
	})
	return err
}

func visit(m protoreflect.Message) error {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		return walkAny(m)
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		return fmt.Errorf("typed config %s: %w", a.GetTypeUrl(), err)
	}
	if err := Validate(inner); err != nil {
		return fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
	}
	return nil
}

// valid checks a resource just built: its generated validation, and the
// deep check (opening every Any) when something packed into it failed.
func (g *gen) valid(m proto.Message, packErrsBefore int) error {
	if g.packErrs > packErrsBefore {
		return Validate(m)
	}
	if v, ok := m.(interface{ Validate() error }); ok {
		return v.Validate() // unwrapped: the generated message names the field
	}
	return nil
}
