package app

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// PodAnnotationsFile is where the injected sidecar mounts the pod's
// annotations (a downward API volume, as Istio's templates mount it).
const PodAnnotationsFile = "/etc/istio/pod/annotations"

// maxPodAnnotations bounds what is read: Kubernetes keeps a pod's
// annotations within 256 KiB; the file quotes them.
const maxPodAnnotations = 1 << 20

// readPodAnnotations reads the downward API's annotations file: a line
// per annotation, key="value" with the value quoted as Go quotes strings
// (Kubernetes' fieldpath.FormatMap). No file is no annotations.
func readPodAnnotations(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pod annotations: %w", err)
	}
	defer f.Close()
	return parsePodAnnotations(io.LimitReader(f, maxPodAnnotations+1))
}

func parsePodAnnotations(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxPodAnnotations+1)
	read := 0
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if read += len(line) + 1; read > maxPodAnnotations {
			return nil, fmt.Errorf("pod annotations: more than %d bytes", maxPodAnnotations)
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, quoted, ok := strings.Cut(line, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("pod annotations: line %d is not key=\"value\"", n)
		}
		v, err := strconv.Unquote(quoted)
		if err != nil {
			return nil, fmt.Errorf("pod annotations: line %d (%s): the value is not quoted: %w", n, k, err)
		}
		out[k] = v
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("pod annotations: more than %d bytes", maxPodAnnotations)
	} else if err != nil {
		return nil, fmt.Errorf("pod annotations: %w", err)
	}
	return out, nil
}
