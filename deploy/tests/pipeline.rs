//! The image pipeline against the real Docker daemon.

use hako_deploy::{AGENT, LABEL_HASH, Pipeline, connect_docker};

#[tokio::test]
async fn agent_image_is_tagged_by_content_and_not_rebuilt_when_unchanged() {
    let tag = hako_deploy::ensure_agent_image()
        .await
        .expect("image builds");
    let pipeline = Pipeline::new(connect_docker().expect("docker"));
    let hash = pipeline.content_hash(&AGENT).expect("hash");
    assert_eq!(tag, format!("hako-agent:{hash}"));

    let docker = connect_docker().expect("docker");
    let before = docker.inspect_image(&tag).await.expect("the image exists");
    let labels = before
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default();
    assert_eq!(labels.get(LABEL_HASH), Some(&hash));
    // FROM scratch with one static binary: small, and runs as the agent user.
    assert!(
        before.size.unwrap_or(i64::MAX) < 32 << 20,
        "{:?}",
        before.size
    );
    let user = before.config.as_ref().and_then(|c| c.user.clone());
    assert_eq!(user.as_deref(), Some("1000:1000"));

    // Unchanged sources: ensure is a lookup, the image is the very same one.
    let again = pipeline.ensure(&AGENT).await.expect("ensure");
    assert_eq!(again, tag);
    let after = docker.inspect_image(&tag).await.expect("still there");
    assert_eq!(before.id, after.id);
    assert_eq!(before.created, after.created);
}
