"""The fixture generator: runs the original implementations (bilm-tf, AllenNLP) in side
environments of their own and records what they compute into tests/fixtures/. See
tests/fixtures/README.md and CONTRIBUTING.md."""
