module singleton.dev/shfmt-tool

go 1.26.8

require mvdan.cc/sh/v3 v3.14.1

require (
	github.com/google/renameio/v2 v2.0.2 // indirect
	github.com/rogpeppe/go-internal v1.15.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/term v0.45.0 // indirect
	mvdan.cc/editorconfig v0.3.0 // indirect
)
