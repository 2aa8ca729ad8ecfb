//! Throwaway certificates for link TLS tests (rcgen, ring): a CA and
//! leaves it signed, each for both server and client use, naming
//! 127.0.0.1 and localhost. Test code only: the stream's `tls` unit tests
//! and `tests/conformance.rs` include it by path.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

/// A CA and two leaves it signed (PEM).
pub struct TestPki {
    /// The CA's certificate.
    pub ca: String,
    /// A leaf (certificate, key) for the accepting side.
    pub server: (String, String),
    /// A leaf (certificate, key) for the connecting side.
    #[allow(dead_code)] // the conformance suite's domains all use `server`
    pub client: (String, String),
}

fn leaf(issuer: &CertifiedIssuer<'static, KeyPair>, common_name: &str) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let mut params = CertificateParams::new(names).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).expect("leaf certificate");
    (cert.pem(), key.serialize_pem())
}

/// A fresh CA named `ca_name` and a server and a client leaf it signed.
pub fn test_pki(ca_name: &str) -> TestPki {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, ca_name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA certificate");
    TestPki { ca: issuer.pem(), server: leaf(&issuer, "server"), client: leaf(&issuer, "client") }
}
