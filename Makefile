# Developer shortcuts. The README's commands do not need make.
.PHONY: build generate test
build:
	go build -o bin/basalt ./cmd/basalt

# Regenerate the committed protobuf/gRPC code (needs Debian's protobuf-compiler).
generate:
	./scripts/generate

test:
	./scripts/test
