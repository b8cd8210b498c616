//! The image pipeline against the real Docker daemon.

use hako_deploy::{AGENT, ImageSpec, LABEL_HASH, Pipeline, connect_docker};

#[tokio::test]
async fn agent_image_is_tagged_by_content_and_not_rebuilt_when_unchanged() {
    let tag = hako_deploy::ensure_agent_image()
        .await
        .expect("image builds");
    let docker = connect_docker().expect("docker");
    let pipeline = Pipeline::new(docker.clone());
    let hash = pipeline.content_hash(&AGENT).expect("hash");
    assert_eq!(tag, format!("hako-agent:{hash}"));

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

    // Unchanged sources: ensure is a lookup. A rebuild would not show on the image (Docker's
    // layer cache returns the very same image id and creation time), so the pipeline's own
    // count of builds is what proves none happened.
    let again = pipeline.ensure(&AGENT).await.expect("ensure");
    assert_eq!(again, tag);
    assert_eq!(pipeline.builds(), 0, "an unchanged image was rebuilt");
    let after = docker.inspect_image(&tag).await.expect("still there");
    assert_eq!(before.id, after.id);

    // The count does count: an image whose tag does not exist yet is built, once, and found
    // the second time. (The agent's binary under another image name: its compile is cached.)
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name: &'static str =
        Box::leak(format!("hako-test-pipeline-{}-{nonce}", std::process::id()).into_boxed_str());
    let spec = ImageSpec { name, ..AGENT };
    let built = pipeline.ensure(&spec).await.expect("builds a missing tag");
    assert_eq!(pipeline.builds(), 1, "a missing image is built");
    assert_eq!(pipeline.ensure(&spec).await.expect("found"), built);
    assert_eq!(
        pipeline.builds(),
        1,
        "and found, not rebuilt, once it exists"
    );
    for t in [built, format!("{name}:latest")] {
        docker
            .remove_image(
                &t,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("removing {t}: {e}"));
    }
}
