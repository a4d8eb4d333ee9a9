//! Type-checking and building the blocks, one tool run per language, and where each
//! block's program is then run from.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use super::blocks::{Block, program};
use super::{Unit, repo, step};

pub fn must_exist(path: &Path, how: &str) {
    assert!(
        path.exists(),
        "{} is missing: {how} (`bash .ci/run` does it)",
        path.display()
    );
}

/// The Python blocks, written to `dir`, checked by one `mypy --strict`.
pub async fn python(units: &[&Block], dir: &Path) -> (Vec<Unit>, Result<(), String>) {
    let python = repo().join("target/clients/venv/bin/python");
    must_exist(&python, "build the clients first (bash clients/prepare.sh)");
    std::fs::create_dir_all(dir).expect("python dir");
    let mut written = Vec::new();
    for block in units {
        let path = dir.join(format!("{}.py", block.slug()));
        std::fs::write(&path, program(block)).expect("write");
        written.push(Unit {
            block: (*block).clone(),
            target: path,
        });
    }
    if written.is_empty() {
        return (written, Ok(()));
    }
    let mut mypy = Command::new(&python);
    mypy.current_dir(dir)
        .args([
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
        ])
        .arg(repo().join("target/clients/mypy-cache"))
        .args(written.iter().map(|u| &u.target));
    let checked = step("mypy --strict", mypy).await;
    (written, checked)
}

/// The TypeScript and JavaScript blocks, compiled by one `tsc --strict` into `dir/out`,
/// `dir` being beside the installed package (so that `import 'lockside'` finds it).
pub async fn node(units: &[&Block], dir: &Path) -> (Vec<Unit>, Result<(), String>) {
    let tsc = repo().join("clients/node/node_modules/typescript/bin/tsc");
    must_exist(&tsc, "npm ci in clients/node (bash clients/prepare.sh)");
    must_exist(
        &repo().join("target/clients/node/node_modules/lockside"),
        "build the clients first (bash clients/prepare.sh)",
    );
    std::fs::create_dir_all(dir).expect("node dir");
    std::fs::copy(
        repo().join("tests/client_doc_examples/stand_ins.mts"),
        dir.join("stand_ins.mts"),
    )
    .expect("stand-ins");
    // Node's types as an app has them (`npm install -D @types/node`): the package has
    // no dependencies, so they come from its own dev dependencies (npm ci).
    let type_roots = repo().join("clients/node/node_modules/@types");
    must_exist(
        &type_roots.join("node"),
        "npm ci in clients/node (bash clients/prepare.sh)",
    );
    let type_roots = serde_json::to_string(&type_roots.to_string_lossy()).expect("a path");
    std::fs::write(
        dir.join("tsconfig.json"),
        format!(
            r#"{{
  "compilerOptions": {{
    "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext",
    "lib": ["ES2022"], "types": ["node"], "typeRoots": [{type_roots}], "strict": true,
    "allowJs": true, "checkJs": true, "outDir": "out"
  }},
  "include": ["*.mts", "*.mjs"]
}}
"#
        ),
    )
    .expect("tsconfig");
    let mut written = Vec::new();
    for block in units {
        let ext = if block.lang == "ts" { "mts" } else { "mjs" };
        let name = block.slug();
        std::fs::write(dir.join(format!("{name}.{ext}")), program(block)).expect("write");
        written.push(Unit {
            block: (*block).clone(),
            target: dir.join("out").join(format!("{name}.mjs")),
        });
    }
    let mut command = Command::new("node");
    command.current_dir(dir).arg(&tsc).args(["-p", "."]);
    let checked = step("tsc --strict", command).await;
    (written, checked)
}

/// The Go blocks, each a `package main` of a scratch module that uses `clients/go`,
/// built by one `go build` into `dir/bin`.
pub async fn go(units: &[&Block], dir: &Path) -> (Vec<Unit>, Result<(), String>) {
    let client = repo().join("clients/go");
    std::fs::create_dir_all(dir.join("bin")).expect("go dir");
    std::fs::write(
        dir.join("go.mod"),
        format!(
            "module lockside.example/docs\n\ngo 1.26\n\nrequire github.com/lockside/lockside/clients/go v0.0.0\n\nreplace github.com/lockside/lockside/clients/go => {}\n",
            client.display()
        ),
    )
    .expect("go.mod");
    std::fs::copy(client.join("go.sum"), dir.join("go.sum")).expect("go.sum");
    let mut written = Vec::new();
    for block in units {
        let name = block.slug();
        std::fs::create_dir_all(dir.join(&name)).expect("package dir");
        std::fs::write(dir.join(&name).join("main.go"), program(block)).expect("write");
        written.push(Unit {
            block: (*block).clone(),
            target: dir.join("bin").join(&name),
        });
    }
    let mut command = Command::new("go");
    command
        .current_dir(dir)
        .env("GOFLAGS", "-mod=mod")
        .args(["build", "-o", "bin/", "./..."]);
    let checked = step("go build", command).await;
    (written, checked)
}

/// The classpath of the Java blocks: every module's jar and its compile classpath, as
/// `clients/java/ci.sh build` leaves them.
pub fn java_classpath() -> String {
    let java = repo().join("clients/java");
    let mut parts = Vec::new();
    for module in ["lockside-client", "lockside-spring", "lockside-shedlock"] {
        let target = java.join(module).join("target");
        let jar = target.join(format!("{module}-0.1.0.jar"));
        let classpath = target.join("classpath.txt");
        for path in [&jar, &classpath] {
            must_exist(path, "build the Java jars (bash clients/java/ci.sh build)");
        }
        parts.push(jar.display().to_string());
        parts.push(
            std::fs::read_to_string(&classpath)
                .expect("classpath.txt")
                .trim()
                .to_owned(),
        );
    }
    parts.join(":")
}

/// The Java blocks, each class `Example` of a package of its own, compiled by one
/// `javac` into `dir/classes`.
pub async fn java(units: &[&Block], dir: &Path) -> (Vec<Unit>, Result<(), String>) {
    let classpath = java_classpath();
    let mut written = Vec::new();
    let mut sources = Vec::new();
    for block in units {
        let name = block.slug();
        std::fs::create_dir_all(dir.join(&name)).expect("package dir");
        let source = dir.join(&name).join("Example.java");
        std::fs::write(&source, format!("package {name};\n\n{}", program(block))).expect("write");
        sources.push(source);
        written.push(Unit {
            block: (*block).clone(),
            target: PathBuf::from(format!("{name}.Example")),
        });
    }
    let mut command = Command::new("javac");
    command
        .current_dir(dir)
        .args(["-d", "classes", "-cp", &classpath])
        .args(&sources);
    let checked = step("javac", command).await;
    (written, checked)
}
