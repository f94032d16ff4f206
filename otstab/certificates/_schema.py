"""The certificate format: its JSON Schema, strict reading and writing of certificate files,
and the Q* and cost side files."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import pandas as pd

from ..errors import ValidationError
from ..modeling._datacost import DataCost
from ._hashing import _PANDAS_MAJOR, _datacost_spec, _strict, hash_file

FORMAT = "otstab-certificate"


#: 2: results gained value_lower / value_upper (certified interval) and uncertainty
VERSION = 2


#: The largest certificate file :func:`read_certificate` parses (bytes; a certificate is some
#: kilobytes, with Q* summaries and feature tables well under a megabyte): 64 MiB, overridable
#: per call (``max_bytes=``) or by the environment variable ``OTSTAB_CERT_MAX_BYTES``.
MAX_CERTIFICATE_BYTES = 64 << 20


#: The deepest nesting of JSON arrays and objects a certificate may have (the format's own is
#: below 10).
MAX_CERTIFICATE_DEPTH = 64


#: Characters of a certificate's content that an error message quotes (then an ellipsis).
ECHO_CHARS = 200


def write_certificate(cert: dict, path) -> Path:
    """Validate ``cert`` against the schema and write it as indented strict JSON.

    Returns
    -------
    pathlib.Path
    """
    validate_certificate(cert)
    path = Path(path)
    text = json.dumps(_strict(cert), indent=2, allow_nan=False, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _echo(value, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with an ellipsis (a
    hostile certificate's field may be hundreds of megabytes)."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # (no repr of the whole string)
        return repr(value) + f"... ({limit} characters shown)"
    text = repr(value) if not isinstance(value, (list, dict)) else _short_repr(value, limit)
    return text if len(text) <= limit else text[:limit] + "..."


def _short_repr(obj, limit: int) -> str:
    """The beginning of ``repr`` of a list or dict, built only up to ``limit`` characters."""
    items = obj.items() if isinstance(obj, dict) else obj
    parts, size = [], 0
    for item in items:
        part = (f"{_echo(item[0], limit)}: {_echo(item[1], limit)}" if isinstance(obj, dict)
                else _echo(item, limit))
        parts.append(part)
        size += len(part) + 2
        if size > limit:
            break
    text = ", ".join(parts)
    return ("{" + text + "}") if isinstance(obj, dict) else ("[" + text + "]")


def _clip(text: str, limit: int = 2 * ECHO_CHARS) -> str:
    """A message cut to ``limit`` characters with an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "..."


def _max_bytes(max_bytes) -> int:
    if max_bytes is not None:
        return int(max_bytes)
    env = os.environ.get("OTSTAB_CERT_MAX_BYTES")
    if env:
        try:
            return int(env)
        except ValueError:
            raise ValidationError("OTSTAB_CERT_MAX_BYTES must be an integer number of bytes, "
                                  f"got {_echo(env)}") from None
    return MAX_CERTIFICATE_BYTES


def read_certificate(path, *, max_bytes: int | None = None) -> dict:
    """Read a certificate file (JSON) and check its format and version.

    The file must be UTF-8 JSON of at most ``max_bytes`` bytes (default
    :data:`MAX_CERTIFICATE_BYTES`, 64 MiB, or the environment variable
    ``OTSTAB_CERT_MAX_BYTES``), nested at most :data:`MAX_CERTIFICATE_DEPTH` deep; anything else
    (including numbers Python will not convert, such as integers of thousands of digits) is a
    :class:`~otstab.errors.ValidationError` whose message quotes at most
    :data:`ECHO_CHARS` characters of the content.
    """
    path = Path(path)
    limit = _max_bytes(max_bytes)
    try:
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise ValidationError(f"cannot read certificate {str(path)!r}: {exc.strerror}") from exc
    if len(raw) > limit:
        raise ValidationError(
            f"certificate {str(path)!r} is larger than {limit} bytes (a certificate is some "
            "kilobytes); raise the limit with read_certificate(..., max_bytes=) or the "
            "environment variable OTSTAB_CERT_MAX_BYTES if the file is genuine")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            f"certificate {str(path)!r} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start})") from None
    del raw
    try:
        cert = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"certificate {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    except RecursionError:  # the parser's own guard, some 1,000 levels deep
        raise ValidationError(
            f"certificate {str(path)!r} nests arrays / objects too deep to parse; a "
            f"certificate has at most {MAX_CERTIFICATE_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer of 5,000 digits
        if isinstance(exc, ValidationError):
            raise
        why = " ".join(str(exc).split(";")[0].split())  # (not Python's advice on limits)
        raise ValidationError(f"certificate {str(path)!r} is not valid JSON: {_clip(why)}"
                              ) from None
    validate_certificate(cert)
    return cert


def _object_depth(obj) -> int:
    """Nesting depth of parsed JSON (iterative: no recursion on a hostile object)."""
    top = 0
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            top = max(top, d)
            if top > MAX_CERTIFICATE_DEPTH:
                return top
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return top


def _unique_keys(pairs) -> dict:
    """``object_pairs_hook`` of :func:`read_certificate`: a key stated twice is an error (plain
    JSON keeps the last one silently, so a reader and a checker could see different values)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValidationError(f"certificate has the key {_echo(key)} twice in one object; "
                                  "every field must be stated once")
        out[key] = value
    return out


def _no_constant(token: str):
    raise ValidationError(f"certificate contains the non-standard JSON number {token}; "
                          'non-finite numbers are written "inf", "-inf" or "nan"')


def load_schema() -> dict:
    """The JSON Schema of the certificate format (shipped as package data)."""
    schema = resources.files("otstab.certificates").joinpath("schema/certificate.schema.json")
    text = schema.read_text(encoding="utf-8")
    return json.loads(text)


def validate_certificate(cert) -> None:
    """Check the format marker, the version and (with jsonschema installed) the schema.

    Raises
    ------
    ValidationError
        Naming the first offending field.
    """
    if not isinstance(cert, dict):
        raise ValidationError(f"a certificate must be a JSON object, got {type(cert).__name__}")
    if cert.get("format") != FORMAT:
        raise ValidationError(
            f"not an otstab certificate: format is {_echo(cert.get('format'))}, expected "
            f"{FORMAT!r}")
    if cert.get("version") != VERSION:
        raise ValidationError(
            f"unsupported certificate version {_echo(cert.get('version'))}; this otstab reads "
            f"version {VERSION}")
    depth = _object_depth(cert)
    if depth > MAX_CERTIFICATE_DEPTH:
        raise ValidationError(f"certificate nests arrays / objects {depth} deep; a certificate "
                              f"has at most {MAX_CERTIFICATE_DEPTH} levels")
    schema = load_schema()
    _reject_unknown_keys(cert, schema, "")
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is optional
        return
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(_strict(cert)), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = _clip("/".join(str(p) for p in err.path) or "(top level)")
        raise ValidationError(f"certificate field {where}: {_clip(err.message)}")


def _reject_unknown_keys(obj, schema: dict, where: str) -> None:
    """Raise on a key the schema does not define, in every object whose schema is closed
    (``additionalProperties: false``); works without the optional jsonschema package."""
    props = schema.get("properties")
    if not isinstance(obj, dict) or props is None:
        return
    if schema.get("additionalProperties") is False:
        unknown = sorted(str(k) for k in obj if k not in props)
        if unknown:
            raise ValidationError(f"certificate field {_clip(where or '(top level)')}: unknown "
                                  f"key(s) {_echo(unknown)}; version {VERSION} defines "
                                  f"{sorted(props)}")
    for key, sub in props.items():
        if key in obj:
            _reject_unknown_keys(obj[key], sub, f"{where}/{key}" if where else key)


def read_table(path) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``, ``.txt``) or Parquet (``.parquet``, ``.pq``) file.

    CSV floats are parsed exactly (``float_precision="round_trip"`` before pandas 3, the
    default since), so floats written with ``repr`` precision come back bit for bit.
    """
    path = Path(path)
    name = path.name.lower()
    if not path.exists():
        raise ValidationError(f"file {str(path)!r} does not exist")
    try:
        if name.endswith((".parquet", ".pq")):
            return pd.read_parquet(path)
        if name.endswith((".csv", ".csv.gz", ".txt", ".tsv")):
            sep = "\t" if name.endswith(".tsv") else ","
            # pandas >= 3 parses floats exactly by default and deprecates the option
            extra = {} if _PANDAS_MAJOR >= 3 else {"float_precision": "round_trip"}
            return pd.read_csv(path, sep=sep, **extra)
    except ImportError as exc:
        raise ValidationError(
            f"reading {str(path)!r} needs pyarrow (pip install pyarrow): {exc}") from exc
    except Exception as exc:  # a malformed file is the user's input
        raise ValidationError(f"cannot read {str(path)!r} as a table: {exc}") from exc
    raise ValidationError(
        f"file {str(path)!r} has an unsupported type; expected .csv, .csv.gz, .tsv or .parquet")


def write_qstar(result, path) -> dict:
    """Write the atoms of Q* (:meth:`StabilityResult.to_frame`) to CSV or Parquet.

    Returns
    -------
    dict
        ``{"file", "format", "n_atoms", "sha256"}``, to pass as ``qstar=`` to
        :func:`make_certificate`.
    """
    path = Path(path)
    # under a DataCost, Q* is a data set in the data's own columns and units
    frame = result.to_frame(raw=_datacost_spec(result) is not None)
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        try:
            frame.to_parquet(path, index=False)
        except ImportError as exc:
            raise ValidationError(
                f"writing {str(path)!r} needs pyarrow (pip install pyarrow)") from exc
        fmt = "parquet"
    elif name.endswith((".csv", ".csv.gz")):
        frame.to_csv(path, index=False, float_format="%.17g")
        fmt = "csv"
    else:
        raise ValidationError(
            f"Q* file {str(path)!r} must end in .csv, .csv.gz or .parquet")
    return {"file": path.name, "format": fmt, "n_atoms": int(len(frame)),
            "sha256": hash_file(path)}


def read_cost_file(path):
    """A DataCost spec file (``DataCost.to_dict()`` as JSON; e.g. the one a risk team
    versions next to the model). Errors name the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cost file {str(path)!r}: cannot read it ({exc.strerror})") \
            from exc
    try:
        spec = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"cost file {str(path)!r} is not valid JSON: {exc.msg} at line "
                              f"{exc.lineno}") from exc
    except ValidationError as exc:
        raise ValidationError(f"cost file {str(path)!r}: {exc}") from exc
    if isinstance(spec, dict) and spec.get("kind") == "datacost" and "spec" in spec:
        spec = spec["spec"]  # the inputs.cost block of a certificate
    try:
        return DataCost.from_dict(spec)
    except (ValidationError, TypeError, ValueError) as exc:
        raise ValidationError(f"cost file {str(path)!r}: {exc}") from exc
