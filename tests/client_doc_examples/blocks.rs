//! The documentation's fenced blocks and their markers: finding them, what a marker
//! says, a fragment put into its wrapper, and the check of a Rust block's `part of`.

use super::repo;

/// What the marker says to do with a block.
#[derive(Clone, Debug, PartialEq)]
pub enum Marker {
    Run {
        wrapper: Option<String>,
    },
    Check {
        wrapper: Option<String>,
    },
    Background {
        key: String,
    },
    PartOf(String),
    /// One file of a Maven project the page builds (`pom.xml`, a `.java` source,
    /// `application.yaml`); its Java file is then run (see `maven.rs`).
    File {
        name: String,
        project: String,
    },
    NotRun,
}

impl Marker {
    pub fn parse(text: &str) -> Result<Self, String> {
        let reason = |rest: &str| -> Result<(), String> {
            if rest.trim().is_empty() {
                Err(format!("{text:?} gives no reason"))
            } else {
                Ok(())
            }
        };
        if let Some(rest) = text.strip_prefix("not run:") {
            reason(rest)?;
            return Ok(Marker::NotRun);
        }
        if text == "run" {
            return Ok(Marker::Run { wrapper: None });
        }
        if let Some(wrapper) = text.strip_prefix("run in ") {
            return Ok(Marker::Run {
                wrapper: Some(wrapper.trim().to_owned()),
            });
        }
        if let Some(rest) = text.strip_prefix("check:") {
            reason(rest)?;
            return Ok(Marker::Check { wrapper: None });
        }
        if let Some(rest) = text.strip_prefix("check in ") {
            let (wrapper, why) = rest
                .split_once(':')
                .ok_or_else(|| format!("{text:?} gives no reason"))?;
            reason(why)?;
            return Ok(Marker::Check {
                wrapper: Some(wrapper.trim().to_owned()),
            });
        }
        if let Some(key) = text.strip_prefix("background holding ") {
            return Ok(Marker::Background {
                key: key.trim().to_owned(),
            });
        }
        if let Some(rest) = text.strip_prefix("file ") {
            let (name, project) = rest
                .split_once(" of project ")
                .ok_or_else(|| format!("{text:?}: `file NAME of project PROJECT`"))?;
            return Ok(Marker::File {
                name: name.trim().to_owned(),
                project: project.trim().to_owned(),
            });
        }
        if let Some(path) = text.strip_prefix("part of ") {
            return Ok(Marker::PartOf(path.trim().to_owned()));
        }
        Err(format!("unknown marker {text:?}"))
    }
}

/// A fenced block of a page.
#[derive(Clone, Debug)]
pub struct Block {
    /// `README.md:74`: the page, relative to the repository, and the opening fence's line.
    pub place: String,
    pub page: String,
    pub lang: String,
    pub marker: Marker,
    /// The block's lines, without the fence's indentation.
    pub text: String,
}

impl Block {
    /// A name for its files: letters, digits and `_`, unique per block.
    pub fn slug(&self) -> String {
        let name: String = self
            .place
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("ex_{name}")
    }
}

/// Every fenced block of `text` (the page `page`); an error names each block without a
/// valid marker.
pub fn blocks_of(page: &str, text: &str) -> (Vec<Block>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut blocks, mut errors) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let Some(info) = line.trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let place = format!("{page}:{}", i + 1);
        let lang = info.split_whitespace().next().unwrap_or("").to_owned();
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("{place}: the block never ends"));
        let body: Vec<&str> = lines[i + 1..end]
            .iter()
            .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
            .collect();
        let marker = i
            .checked_sub(1)
            .map(|p| lines[p].trim())
            .and_then(|p| p.strip_prefix("<!-- example:"))
            .and_then(|p| p.strip_suffix("-->"))
            .map(|m| Marker::parse(m.trim()));
        match marker {
            None => errors.push(format!(
                "{place}: no `<!-- example: ... -->` line just before the fence"
            )),
            Some(Err(e)) => errors.push(format!("{place}: {e}")),
            Some(Ok(marker)) => {
                if let Err(e) = fits(&lang, &marker) {
                    errors.push(format!("{place}: {e}"));
                }
                blocks.push(Block {
                    place,
                    page: page.to_owned(),
                    lang,
                    marker,
                    text: body.join("\n") + "\n",
                });
            }
        }
        i = end + 1;
    }
    (blocks, errors)
}

/// Whether this test can do what `marker` says with a block of `lang`.
pub fn fits(lang: &str, marker: &Marker) -> Result<(), String> {
    let ok = match marker {
        Marker::NotRun => true,
        Marker::PartOf(_) => lang == "rust",
        Marker::Background { .. } => lang == "sh",
        Marker::File { name, .. } => match lang {
            "xml" => name == "pom.xml",
            "yaml" => name == "application.yaml",
            "java" => name.ends_with(".java"),
            _ => false,
        },
        Marker::Run { wrapper } => {
            matches!(lang, "python" | "ts" | "js" | "go" | "java")
                || (lang == "sh" && wrapper.is_none())
        }
        Marker::Check { .. } => matches!(lang, "python" | "ts" | "js" | "go" | "java"),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "this test cannot do {marker:?} with a `{lang}` block"
        ))
    }
}

/// The block's program: as written, or in place of its wrapper's `EXAMPLE` line.
pub fn program(block: &Block) -> String {
    let wrapper = match &block.marker {
        Marker::Run { wrapper } | Marker::Check { wrapper } => wrapper.as_deref(),
        _ => None,
    };
    let Some(wrapper) = wrapper else {
        return block.text.clone();
    };
    let path = repo().join("tests/client_doc_examples").join(wrapper);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: wrapper {}: {e}", block.place, path.display()));
    let mut out = String::new();
    let mut spliced = 0;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed == "# EXAMPLE" || trimmed == "// EXAMPLE" {
            spliced += 1;
            let indent = &line[..line.len() - trimmed.len()];
            for l in block.text.lines() {
                if !l.is_empty() {
                    out.push_str(indent);
                }
                out.push_str(l);
                out.push('\n');
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert_eq!(spliced, 1, "{wrapper} has one EXAMPLE line");
    out
}

/// The lines of `block` appear, in order and together, in `path` (blank lines aside, and
/// runs of spaces counted as one, so that aligned comments match rustfmt's).
pub fn part_of(block: &Block, path: &str) -> Result<(), String> {
    let file = std::fs::read_to_string(repo().join(path))
        .map_err(|e| format!("{}: {path}: {e}", block.place))?;
    let lines = |t: &str| -> Vec<String> {
        t.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|l| !l.is_empty())
            .collect()
    };
    let (want, have) = (lines(&block.text), lines(&file));
    if have.windows(want.len()).any(|w| w == want.as_slice()) {
        Ok(())
    } else {
        Err(format!("{}: the block is not part of {path}", block.place))
    }
}
