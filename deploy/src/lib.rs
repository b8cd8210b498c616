//! hako's image pipeline: static binaries into FROM scratch images, tagged by content hash.
