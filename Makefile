# Developer shortcuts. The README's commands do not need make.
GOBIN_TOOLS := $(CURDIR)/.tools

.PHONY: build generate test
build:
	go build -o bin/basalt ./cmd/basalt

# Regenerate the committed protobuf/gRPC code (needs Debian's protobuf-compiler).
generate:
	mkdir -p $(GOBIN_TOOLS)
	go build -o $(GOBIN_TOOLS)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	go build -o $(GOBIN_TOOLS)/protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc
	cd pkg/api && protoc --plugin=protoc-gen-go=$(GOBIN_TOOLS)/protoc-gen-go \
		--plugin=protoc-gen-go-grpc=$(GOBIN_TOOLS)/protoc-gen-go-grpc \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative mds.proto

test:
	./scripts/test
