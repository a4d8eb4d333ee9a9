//! The documentation's Maven projects: the blocks marked `file NAME of project PROJECT`
//! of one page make one project (its `pom.xml`, one Java source, and for a Spring Boot
//! application its `application.yaml`), built by Maven as a user would build it (the
//! Lockside artifacts come from `~/.m2`, where `bash clients/java/ci.sh build` installs
//! them) and then run: a plain program must exit 0; a Spring Boot application (a source
//! with `@SpringBootApplication`) must start (Boot's "Started" line) without a logging
//! warning, and is then stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokio::process::Command;

use super::blocks::{Block, Marker};
use super::{Unit, step_within};

/// The bound for one project's Maven build.
const MAVEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(180);

/// A project's name and the page it is on.
fn project_of(block: &Block) -> Option<(String, String)> {
    match &block.marker {
        Marker::File { project, .. } => Some((block.page.clone(), project.clone())),
        _ => None,
    }
}

/// Where a project's file goes: the pom at the root, the yaml among the resources, a
/// Java source under its package's directory.
fn place_of(name: &str, text: &str) -> PathBuf {
    match name {
        "pom.xml" => PathBuf::from("pom.xml"),
        "application.yaml" => PathBuf::from("src/main/resources/application.yaml"),
        _ => {
            let mut path = PathBuf::from("src/main/java");
            if let Some(package) = package_of(text) {
                path.push(package.replace('.', "/"));
            }
            path.join(name)
        }
    }
}

fn package_of(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("package "))
        .map(|p| p.trim_end_matches(';').trim().to_owned())
}

/// The class a project's Java source runs as.
pub fn main_class(block: &Block) -> String {
    let Marker::File { name, .. } = &block.marker else {
        panic!("{}: not a project file", block.place);
    };
    let class = name.trim_end_matches(".java");
    match package_of(&block.text) {
        Some(package) => format!("{package}.{class}"),
        None => class.to_owned(),
    }
}

/// Whether a project's program is a Spring Boot application (runs until stopped).
pub fn is_boot(block: &Block) -> bool {
    block.text.contains("@SpringBootApplication")
}

/// Writes and builds every project (one Maven run each, all at once); the units
/// to run are their Java sources, whose target is the project's directory.
pub async fn maven(blocks: &[&Block], dir: &Path) -> (Vec<Unit>, Result<(), String>) {
    let mut projects: BTreeMap<(String, String), Vec<&Block>> = BTreeMap::new();
    for block in blocks {
        if let Some(key) = project_of(block) {
            projects.entry(key).or_default().push(block);
        }
    }
    let mut units = Vec::new();
    let mut errors = Vec::new();
    // Every project's build at once: they wait on downloads more than on the CPU.
    let mut builds = tokio::task::JoinSet::new();
    for ((page, project), files) in projects {
        let root = dir.join(format!(
            "{}-{project}",
            page.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        let mut sources = Vec::new();
        for block in &files {
            let Marker::File { name, .. } = &block.marker else {
                continue;
            };
            let path = root.join(place_of(name, &block.text));
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("project dir");
            std::fs::write(&path, &block.text).expect("write");
            if block.lang == "java" {
                sources.push(*block);
            }
        }
        let (has_pom, one_source) = (
            files
                .iter()
                .any(|b| matches!(&b.marker, Marker::File { name, .. } if name == "pom.xml")),
            sources.len() == 1,
        );
        if !has_pom || !one_source {
            errors.push(format!(
                "{page}: project {project} needs a pom.xml and one Java source"
            ));
            continue;
        }
        let mut mvn = Command::new("mvn");
        mvn.current_dir(&root).args([
            "-B",
            "-q",
            "compile",
            "dependency:build-classpath",
            "-Dmdep.outputFile=classpath.txt",
        ]);
        // Longer than a compile's bound: a fresh ~/.m2 downloads the plugins of the
        // project's own pom (Boot's parent names its own versions) here.
        let what = format!("mvn compile ({page}, {project})");
        builds.spawn(async move { step_within(&what, mvn, MAVEN_WITHIN).await });
        units.push(Unit {
            block: sources[0].clone(),
            target: root,
        });
    }
    while let Some(built) = builds.join_next().await {
        if let Err(e) = built.expect("a build task") {
            errors.push(e);
        }
    }
    let result = if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n\n"))
    };
    (units, result)
}

/// The command that runs a built project's program from its classes and classpath.
pub fn run_command(unit: &Unit) -> Command {
    let classpath = std::fs::read_to_string(unit.target.join("classpath.txt"))
        .expect("the project's classpath.txt");
    let mut c = Command::new("java");
    c.arg("-cp")
        .arg(format!(
            "{}:{}",
            unit.target.join("target/classes").display(),
            classpath.trim()
        ))
        .arg(main_class(&unit.block));
    c
}
