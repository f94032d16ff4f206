"""Certificate files: hashing of model and data, making a certificate from a result, the JSON
schema (``schema/certificate.schema.json``) and file I/O, and the independent verification.
Certificates written by earlier versions load unchanged."""

from ._certificate import (
    FORMAT,
    VERSION,
    Mismatch,
    VerificationReport,
    hash_data,
    hash_model,
    load_schema,
    make_certificate,
    read_certificate,
    validate_certificate,
    verify_certificate,
    write_certificate,
)

__all__ = ["FORMAT", "VERSION", "Mismatch", "VerificationReport", "hash_data", "hash_model",
           "load_schema", "make_certificate", "read_certificate", "validate_certificate",
           "verify_certificate", "write_certificate"]
