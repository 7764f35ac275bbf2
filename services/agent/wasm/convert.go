package wasm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	udpav1 "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	httprbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netrbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	netwasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// The environment variables discovery adds to a module's VM for the
// agent (proxycontract, as Istio's pkg/model/wasm.go); every ISTIO_META_
// variable is stripped before Envoy sees the resource.
const (
	envPullSecret      = proxycontract.WasmPullSecretEnv
	envPullPolicy      = proxycontract.WasmPullPolicyEnv
	envResourceVersion = proxycontract.WasmResourceVersionEnv
	istioMetaPrefix    = proxycontract.WasmMetaPrefix
)

// The type URLs Convert reads.
const (
	typePrefix      = "type.googleapis.com/"
	httpWasmType    = typePrefix + "envoy.extensions.filters.http.wasm.v3.Wasm"
	networkWasmType = typePrefix + "envoy.extensions.filters.network.wasm.v3.Wasm"
	typedStructType = typePrefix + "udpa.type.v1.TypedStruct"
)

// The stat prefixes of the fallback filters, Istio's.
const (
	allowStatPrefix = "wasm-default-allow"
	denyStatPrefix  = "wasm-default-deny"
)

// Convert rewrites, in place, the ECDS resources (TypedExtensionConfigs)
// that load a Wasm filter remotely to load the module from the cache, as
// Istio's MaybeConvertWasmExtensionConfig: a failed fetch replaces the
// resource by an allow-all or deny-all RBAC filter by its failure policy,
// and other resources pass unchanged. It returns an error, having left
// the other resources converted, when a resource cannot be decoded: the
// response is then to be refused. Resources are converted in parallel,
// ConvertConcurrency at a time.
func (c *Cache) Convert(ctx context.Context, resources []*anypb.Any) error {
	start := c.o.now()
	defer func() { c.metrics.converted(c.o.now().Sub(start)) }()
	errs := make([]error, len(resources))
	sem := make(chan struct{}, c.o.ConvertConcurrency)
	var wg sync.WaitGroup
	for i, r := range resources {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			resources[i], errs[i] = c.convert(ctx, r)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// filter is a decoded Wasm filter, HTTP or network.
type filter struct {
	msg     proto.Message
	config  *wasmv3.PluginConfig
	network bool
}

func (c *Cache) convert(ctx context.Context, r *anypb.Any) (*anypb.Any, error) {
	ec, f, err := decode(r)
	if err != nil {
		c.metrics.conversion(resultUnmarshalFailure)
		return r, err
	}
	if f == nil {
		c.metrics.conversion(resultNoRemoteLoad)
		return r, nil
	}
	result, err := c.localize(ctx, ec.GetName(), f.config.GetVmConfig())
	if err != nil {
		c.metrics.conversion(result)
		c.log.Warn("wasm module not fetched: the filter is replaced by RBAC", "resource", ec.GetName(),
			"allows_all", failOpen(f.config), "error", err)
		out, merr := rbacFallback(ec.GetName(), f.network, failOpen(f.config))
		if merr != nil {
			return r, fmt.Errorf("fallback of wasm filter %q: %w", ec.GetName(), merr)
		}
		return out, nil
	}
	if ec.TypedConfig, err = anypb.New(f.msg); err == nil {
		var out *anypb.Any
		if out, err = anypb.New(ec); err == nil {
			c.metrics.conversion(resultSuccess)
			return out, nil
		}
	}
	c.metrics.conversion(resultMarshalFailure)
	return r, fmt.Errorf("wasm filter %q: %w", ec.GetName(), err)
}

// decode is Istio's tryUnmarshal: the extension config and its Wasm
// filter when the filter loads its code remotely; a nil filter for
// anything else.
func decode(r *anypb.Any) (*corev3.TypedExtensionConfig, *filter, error) {
	ec := &corev3.TypedExtensionConfig{}
	if err := r.UnmarshalTo(ec); err != nil {
		return nil, nil, fmt.Errorf("extension config: %w", err)
	}
	tc := ec.GetTypedConfig()
	if tc == nil {
		return nil, nil, fmt.Errorf("extension config %q has no typed config", ec.GetName())
	}
	typeURL, value := tc.GetTypeUrl(), []byte(nil)
	var fromStruct *udpav1.TypedStruct
	switch typeURL {
	case httpWasmType, networkWasmType:
		value = tc.GetValue()
	case typedStructType:
		fromStruct = &udpav1.TypedStruct{}
		if err := tc.UnmarshalTo(fromStruct); err != nil {
			return nil, nil, fmt.Errorf("extension config %q: %w", ec.GetName(), err)
		}
		typeURL = fromStruct.GetTypeUrl()
	default:
		return ec, nil, nil
	}
	var f filter
	switch typeURL {
	case httpWasmType:
		w := &httpwasmv3.Wasm{}
		f = filter{msg: w}
	case networkWasmType:
		w := &netwasmv3.Wasm{}
		f = filter{msg: w, network: true}
	default:
		return ec, nil, nil // a typed struct of something else
	}
	var err error
	if fromStruct != nil {
		var js []byte
		if js, err = protojson.Marshal(fromStruct.GetValue()); err == nil {
			err = protojson.Unmarshal(js, f.msg)
		}
	} else {
		err = proto.Unmarshal(value, f.msg)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("wasm filter %q: %w", ec.GetName(), err)
	}
	switch w := f.msg.(type) {
	case *httpwasmv3.Wasm:
		f.config = w.GetConfig()
	case *netwasmv3.Wasm:
		f.config = w.GetConfig()
	}
	code := f.config.GetVmConfig().GetCode()
	if code.GetRemote() == nil {
		if code.GetLocal() == nil {
			return nil, nil, fmt.Errorf("wasm filter %q loads no code, remote or local", ec.GetName())
		}
		return ec, nil, nil
	}
	return ec, &f, nil
}

// localize is Istio's rewriteVMConfig: the agent's variables read and
// stripped, the module fetched, and the code pointed at its file. It
// returns the conversion's result label on failure.
func (c *Cache) localize(ctx context.Context, resource string, vm *wasmv3.VmConfig) (string, error) {
	o := GetOptions{ResourceName: resource}
	if env := vm.GetEnvironmentVariables(); env != nil {
		kv := env.GetKeyValues()
		secret, named := kv[envPullSecret]
		o.PullPolicy = ParsePullPolicy(kv[envPullPolicy])
		o.ResourceVersion = kv[envResourceVersion]
		for k := range kv {
			if strings.HasPrefix(k, istioMetaPrefix) {
				delete(kv, k)
			}
		}
		if len(kv) == 0 {
			env.KeyValues = nil
			if len(env.GetHostEnvKeys()) == 0 {
				vm.EnvironmentVariables = nil
			}
		}
		if named {
			if secret == "" {
				return resultFetchFailure, errors.New("the image pull secret is named but not available")
			}
			o.PullSecret = []byte(secret)
		}
	}
	remote := vm.GetCode().GetRemote()
	uri := remote.GetHttpUri()
	if uri == nil {
		return resultMissRemoteFetchHint, errors.New("the remote code has no http_uri")
	}
	o.Checksum = remote.GetSha256()
	if d := uri.GetTimeout(); d != nil {
		o.Timeout = d.AsDuration()
	}
	path, err := c.Get(ctx, uri.GetUri(), o)
	if err != nil {
		return resultFetchFailure, err
	}
	vm.Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{
		Local: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}},
	}}
	return resultSuccess, nil
}

// failOpen is the filter's failure policy, or its deprecated fail_open
// when unspecified (Istio's httpWasmFailOpen): FAIL_RELOAD and
// FAIL_CLOSED fail closed.
func failOpen(c *wasmv3.PluginConfig) bool {
	if p := c.GetFailurePolicy(); p != wasmv3.FailurePolicy_UNSPECIFIED {
		return p == wasmv3.FailurePolicy_FAIL_OPEN
	}
	return c.GetFailOpen() //nolint:staticcheck // the deprecated field still says it when the policy does not
}

// rbacFallback is the filter that stands in for a Wasm filter whose
// module could not be fetched (Istio's createHTTPDefaultFilter): RBAC
// without rules allows everything, with empty rules denies everything.
func rbacFallback(name string, network, allow bool) (*anypb.Any, error) {
	var rules *rbacv3.RBAC
	prefix := allowStatPrefix
	if !allow {
		rules, prefix = &rbacv3.RBAC{}, denyStatPrefix
	}
	var msg proto.Message = &httprbacv3.RBAC{Rules: rules, RulesStatPrefix: prefix}
	if network {
		msg = &netrbacv3.RBAC{Rules: rules, StatPrefix: prefix}
	}
	tc, err := anypb.New(msg)
	if err != nil {
		return nil, err
	}
	return anypb.New(&corev3.TypedExtensionConfig{Name: name, TypedConfig: tc})
}
