//! Secrets and certificates read from files named on the command line. Errors name the
//! file, never its content.

use std::path::Path;

/// Reads a bearer token from a file: one word, surrounding whitespace ignored. The
/// error names the file, never its content.
pub fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{}: the token must be one non-empty word",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// Reads a PEM file (certificate, key or CA); checks only that it looks like PEM, so
/// a wrong path fails at start rather than at the first handshake.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{}: not a PEM file", path.display()));
    }
    Ok(pem)
}
