//! Request signing after the Standard Webhooks specification (standardwebhooks.com), which
//! Svix, OpenAI and others send, so receivers verify with a library they already have:
//! `webhook-signature: v1,<base64 of HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The key in a Secret's value: `whsec_<base64>` is the specification's form, anything else is
/// taken as the key's bytes.
pub fn key(value: &[u8]) -> Vec<u8> {
    value
        .strip_prefix(b"whsec_")
        .and_then(|b64| STANDARD.decode(b64).ok())
        .unwrap_or_else(|| value.to_vec())
}

/// The `webhook-signature` header's value for a request.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's own example (its reference libraries' tests carry the same).
    #[test]
    fn the_specifications_example_signs_alike() {
        let key = key(b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let sig = signature(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_plain_value_is_the_key_as_it_is() {
        assert_eq!(key(b"s3cret"), b"s3cret".to_vec());
        // Not base64 after the prefix: the whole value.
        assert_eq!(key(b"whsec_!!"), b"whsec_!!".to_vec());
    }
}
