// Package boundedfile reads a whole file that must not be larger than a
// limit: configuration, YAML, certificates. A larger file is refused
// without reading more than the limit and a byte.
package boundedfile

import (
	"fmt"
	"io"
	"os"
)

// Read returns the content of path, or an error naming the path when it
// cannot be read or holds more than max bytes.
func Read(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return data, nil
}
