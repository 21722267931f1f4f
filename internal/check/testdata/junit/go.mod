module github.com/idem-go/idem/internal/check/testdata/junit

go 1.26.0

require github.com/joshdk/go-junit v1.0.0
