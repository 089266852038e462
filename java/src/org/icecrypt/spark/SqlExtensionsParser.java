/*
 * icecrypt's SQL parser extension (injected by org.icecrypt.spark.Extensions): Iceberg's
 * ALTER TABLE extensions on the tables of icecrypt's SQL catalog --
 *
 *   ALTER TABLE t ADD | DROP | REPLACE PARTITION FIELD ...
 *   ALTER TABLE t WRITE [DISTRIBUTED BY PARTITION] [[LOCALLY] ORDERED BY ... | UNORDERED]
 *   ALTER TABLE t SET | DROP IDENTIFIER FIELDS ...
 *   ALTER TABLE t CREATE [OR REPLACE] | REPLACE BRANCH | TAG ..., DROP BRANCH | TAG ...
 *
 * A statement of that shape whose table belongs to a catalog of class
 * org.icecrypt.spark.SparkCatalog becomes the call of that catalog's procedure alter_table
 * with the table and the clause as they were written
 * (CALL cat.system.alter_table(table => 'db.t', clause => 'ADD PARTITION FIELD days(ts)')),
 * parsed by Spark's own parser: the driver's icecrypt.spark._sql.alter reads the clause and
 * makes the change through icecrypt's table API, in one commit.  Everything else, and these
 * statements on any other catalog's tables, goes to Spark's parser unchanged.
 */
package org.icecrypt.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.parser.ParameterContext;
import org.apache.spark.sql.catalyst.parser.ParseException;
import org.apache.spark.sql.catalyst.parser.ParserInterface;
import org.apache.spark.sql.catalyst.parser.SqlStatementSplitResult;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;

public final class SqlExtensionsParser implements ParserInterface {
    static final String CATALOG_CLASS = "org.icecrypt.spark.SparkCatalog";

    /** The clauses this parser takes over, after ALTER TABLE <identifier>. */
    private static final Pattern CLAUSE = Pattern.compile(
        "(?:(?:ADD|DROP|REPLACE)\\s+PARTITION\\s+FIELD|WRITE|(?:SET|DROP)\\s+IDENTIFIER\\s+FIELDS"
            + "|CREATE\\s+OR\\s+REPLACE\\s+(?:BRANCH|TAG)|(?:CREATE|REPLACE|DROP)\\s+(?:BRANCH|TAG))\\b[\\s\\S]*",
        Pattern.CASE_INSENSITIVE);
    private static final Pattern ALTER_TABLE = Pattern.compile("ALTER\\s+TABLE\\s+", Pattern.CASE_INSENSITIVE);
    private static final Pattern PART = Pattern.compile("`(?:[^`]|``)*`|[A-Za-z0-9_]+");

    private final SparkSession session;
    private final ParserInterface delegate;

    public SqlExtensionsParser(SparkSession session, ParserInterface delegate) {
        this.session = session;
        this.delegate = delegate;
    }

    @Override
    public LogicalPlan parsePlan(String sqlText) throws ParseException {
        String call = rewrite(sqlText);
        return delegate.parsePlan(call != null ? call : sqlText);
    }

    @Override
    public LogicalPlan parsePlanWithParameters(String sqlText, ParameterContext context) throws ParseException {
        String call = rewrite(sqlText);
        return delegate.parsePlanWithParameters(call != null ? call : sqlText, context);
    }

    /** The CALL that runs sqlText, or null when it is not an extension statement on a table
     * of an icecrypt catalog. */
    String rewrite(String sqlText) {
        String text = stripComments(sqlText).strip();
        while (text.endsWith(";")) {
            text = text.substring(0, text.length() - 1).strip();
        }
        Matcher alter = ALTER_TABLE.matcher(text);
        if (!alter.lookingAt()) {
            return null;
        }
        List<String> parts = new ArrayList<>();
        int i = alter.end();
        Matcher part = PART.matcher(text);
        while (true) {
            if (!part.find(i) || part.start() != i) {
                return null;
            }
            String token = part.group();
            parts.add(token.startsWith("`") ? token.substring(1, token.length() - 1).replace("``", "`") : token);
            i = part.end();
            if (i < text.length() && text.charAt(i) == '.') {
                i++;
                continue;
            }
            break;
        }
        if (i >= text.length() || !Character.isWhitespace(text.charAt(i))) {
            return null;
        }
        String clause = text.substring(i).strip();
        if (!CLAUSE.matcher(clause).matches()) {
            return null;
        }
        String catalog;
        List<String> table;
        if (parts.size() > 1 && isCatalog(parts.get(0))) {
            catalog = parts.get(0);
            table = parts.subList(1, parts.size());
        } else {
            catalog = session.sessionState().catalogManager().currentCatalog().name();
            table = parts;
            if (parts.size() == 1) {  // a table of the current namespace (USE cat.db)
                table = new ArrayList<>(List.of(session.sessionState().catalogManager().currentNamespace()));
                table.add(parts.get(0));
            }
        }
        if (!CATALOG_CLASS.equals(session.conf().get("spark.sql.catalog." + catalog, ""))) {
            return null;  // not icecrypt's table: Spark's parser says what it says
        }
        List<String> quoted = new ArrayList<>();
        for (String p : table) {
            quoted.add(quoteIdentifier(p));
        }
        return "CALL " + quoteIdentifier(catalog) + ".system.alter_table(table => "
            + literal(String.join(".", quoted)) + ", clause => " + literal(clause) + ")";
    }

    private boolean isCatalog(String name) {
        return session.conf().contains("spark.sql.catalog." + name);
    }

    static String quoteIdentifier(String part) {
        return "`" + part.replace("`", "``") + "`";
    }

    /** A Spark SQL string literal holding text exactly. */
    static String literal(String text) {
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'";
    }

    /** sqlText without -- and bracketed comments outside quotes (Iceberg's extensions parser
     * strips them too before it recognizes a statement). */
    static String stripComments(String sqlText) {
        StringBuilder out = new StringBuilder(sqlText.length());
        int n = sqlText.length();
        int i = 0;
        while (i < n) {
            char c = sqlText.charAt(i);
            if (c == '\'' || c == '"' || c == '`') {
                int j = i + 1;
                while (j < n && sqlText.charAt(j) != c) {
                    j += (sqlText.charAt(j) == '\\' && c != '`') ? 2 : 1;
                }
                j = Math.min(j + 1, n);
                out.append(sqlText, i, j);
                i = j;
            } else if (c == '-' && i + 1 < n && sqlText.charAt(i + 1) == '-') {
                while (i < n && sqlText.charAt(i) != '\n') {
                    i++;
                }
                out.append(' ');
            } else if (c == '/' && i + 1 < n && sqlText.charAt(i + 1) == '*') {
                int end = sqlText.indexOf("*/", i + 2);
                i = end < 0 ? n : end + 2;
                out.append(' ');
            } else {
                out.append(c);
                i++;
            }
        }
        return out.toString();
    }

    // --- everything else is Spark's own ------------------------------------------------------

    @Override
    public Expression parseExpression(String sqlText) throws ParseException {
        return delegate.parseExpression(sqlText);
    }

    @Override
    public TableIdentifier parseTableIdentifier(String sqlText) throws ParseException {
        return delegate.parseTableIdentifier(sqlText);
    }

    @Override
    public FunctionIdentifier parseFunctionIdentifier(String sqlText) throws ParseException {
        return delegate.parseFunctionIdentifier(sqlText);
    }

    @Override
    public scala.collection.immutable.Seq<String> parseMultipartIdentifier(String sqlText) throws ParseException {
        return delegate.parseMultipartIdentifier(sqlText);
    }

    @Override
    public LogicalPlan parseQuery(String sqlText) throws ParseException {
        return delegate.parseQuery(sqlText);
    }

    @Override
    public StructType parseRoutineParam(String sqlText) throws ParseException {
        return delegate.parseRoutineParam(sqlText);
    }

    @Override
    public SqlStatementSplitResult splitStatements(String sqlText) {
        return delegate.splitStatements(sqlText);
    }

    @Override
    public StructType parseTableSchema(String sqlText) throws ParseException {
        return delegate.parseTableSchema(sqlText);
    }

    @Override
    public DataType parseDataType(String sqlText) throws ParseException {
        return delegate.parseDataType(sqlText);
    }

    @Override
    public org.apache.spark.sql.catalyst.parser.TemporalIdentifier parseTemporalTableIdentifier(String sqlText)
            throws ParseException {
        return delegate.parseTemporalTableIdentifier(sqlText);
    }

    @Override
    public String toString() {
        return "SqlExtensionsParser(" + delegate + ")";
    }
}
