//go:build tools

// Package tools makes the weed command a dependency of the build module (weed-go.mod).
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
