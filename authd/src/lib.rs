//! authd: hako's token authority (the only signer).
