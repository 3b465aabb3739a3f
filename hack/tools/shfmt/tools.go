//go:build tools

package tools

import _ "mvdan.cc/sh/v3/cmd/shfmt"
