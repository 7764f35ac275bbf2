package translate
import ("testing";"fmt";"google.golang.org/protobuf/encoding/protojson";"google.golang.org/protobuf/proto";"github.com/flotilla-mesh/flotilla/internal/model")
func TestDbgRDS(t *testing.T){
	s, p := gatewayMesh(&testing.B{}, 3)
	pc, _ := s.Build(model.BuildOptions{}, nil, 1)
	for _, r := range NewGenerator(pc, p).Routes(nil) {
		raw,_ := proto.Marshal(r)
		fmt.Println(r.GetName(), len(raw))
		if r.GetName() == "https.443.https.gateway-1.gateway" { fmt.Println(protojson.Format(r)) }
	}
}
