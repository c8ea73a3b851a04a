// The throw-away module `notiflow stack fetch` builds SeaweedFS's weed in (copied to a
// temporary directory as go.mod, beside weed-tools.go as tools.go). `go install` of the
// weed command refuses SeaweedFS's module because its go.mod has a replace directive, so
// this module repeats that directive, requires the pinned version (`go get`) and builds it.
module notiflow.local/weed

go 1.26.6

replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
