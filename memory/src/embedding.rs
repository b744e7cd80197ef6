//! Whether the index searches by meaning: the embedding model `scripts/setup` fetched, loaded
//! into the index when this build has vectors (feature `vectors`), and what a caller tells a
//! person when search is by words only.

use crate::index::Index;

/// What [`Index::use_installed_embedder`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Embedding {
    /// Loaded: search by words and meaning.
    Loaded,
    /// `scripts/setup` has not fetched the embedding model: search by words only.
    NotFetched,
    /// This build has no vectors (`scripts/install --no-model`): search by words only.
    NotBuilt,
    /// The model is there but did not load (the reason): search by words only.
    Failed(String),
}

impl Embedding {
    /// Why search is by words only, in a few words a person can act on (`None` when loaded).
    pub fn words_only_because(&self) -> Option<String> {
        match self {
            Embedding::Loaded => None,
            Embedding::NotFetched => Some("no embedding model; scripts/setup fetches it".into()),
            Embedding::NotBuilt => Some(
                "this build has no vectors; scripts/install without --no-model adds them".into(),
            ),
            Embedding::Failed(e) => Some(format!("the embedding model did not load: {e}")),
        }
    }
}

impl Index {
    /// Gives the index the embedding model `scripts/setup` fetched (`~/.flock/models`, or
    /// `FLOCK_HOME`'s), so it searches by meaning too; by words only when the model is not there
    /// or this build has no vectors (the feature `vectors`; `scripts/install --no-model` leaves it
    /// out). What happened, for the caller to say.
    pub fn use_installed_embedder(&mut self) -> Embedding {
        #[cfg(feature = "vectors")]
        {
            let Some(dir) = crate::embed::installed_dir() else { return Embedding::NotFetched };
            match crate::embed::Embedder::load(&dir) {
                Ok(e) => {
                    self.set_embedder(std::sync::Arc::new(e));
                    Embedding::Loaded
                }
                Err(e) => Embedding::Failed(e),
            }
        }
        #[cfg(not(feature = "vectors"))]
        Embedding::NotBuilt
    }

    /// Without vectors in this build there is nothing to embed.
    #[cfg(not(feature = "vectors"))]
    pub fn embed_pending(&mut self, _max_passages: usize) -> Result<usize, String> {
        Ok(0)
    }
}
