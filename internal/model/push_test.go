package model_test

import (
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

func TestAPushContextTellsWhatItShares(t *testing.T) {
	pc, _ := model.NewStore().Build(model.BuildOptions{}, nil, 1)
	shared, own := structpb.NewStringValue("shared"), structpb.NewStringValue("shared")
	pc.Share(shared)
	if !pc.Shared(shared) {
		t.Error("a resource shared is not Shared")
	}
	if pc.Shared(own) {
		t.Error("an equal resource that was not shared is Shared: sharing is by identity")
	}
	other, _ := model.NewStore().Build(model.BuildOptions{}, nil, 2)
	if other.Shared(shared) {
		t.Error("another push context shares what this one shared")
	}
}
